//! Consumer-group operations on the master: join (creating the group, and
//! its dead-letter topic, on first use), heartbeat, leave, session expiry,
//! describe, list and delete.
//!
//! Membership changes are registry commands; heartbeats are volatile and
//! kept in [`Coordinator`] under its own mutex, so they never wait for the
//! registry's async lock (which topic operations hold across member calls).
//! Per-event state (shared groups) and positions live with the partitions,
//! on their owners; `describe` asks each owner (`ConsumerGroupStats`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use strom_proto::{
    ConsumerGroupInfo, ConsumerGroupMode, ConsumerGroupSpec, ErrorCode, GroupConsumerInfo,
    GroupPartitionInfo, PartitionStatus, Request, Response, StartPos, TopicSpec,
};

use super::group_machine::{ConsumerGroupMeta, GroupCommand};
use super::machine::RegistryCommand;
use super::{Inner, Registry};
use crate::error::ServerError;
use crate::names::{check_name, check_topic_name};

/// Session timeouts accepted, in milliseconds.
pub const SESSION_RANGE_MS: (u32, u32) = (1_000, 300_000);
/// Visibility timeouts accepted, in milliseconds.
pub const VISIBILITY_RANGE_MS: (u32, u32) = (100, 43_200_000);

/// Volatile membership state: when each consumer was last heard from,
/// and the partitioned groups' handoffs (`coordinator.rs`).
#[derive(Default)]
pub struct Coordinator {
    last_seen: HashMap<(String, u64), Instant>,
    pub(super) parts: super::coordinator::Partitioned,
    /// Kafka groups' members, as their coordinators last reported them.
    pub(super) kafka: HashMap<String, super::kafka_groups::KafkaView>,
}

impl Coordinator {
    /// Records that `consumer` is alive; `UNKNOWN_CONSUMER` if its session
    /// expired or it left.
    pub(super) fn touch(&mut self, group: &str, consumer: u64) -> Result<(), ServerError> {
        match self.last_seen.get_mut(&(group.to_string(), consumer)) {
            Some(t) => {
                *t = Instant::now();
                Ok(())
            }
            None => Err(ServerError::coded(
                ErrorCode::UNKNOWN_CONSUMER,
                format!("consumer {consumer} is not a member of group '{group}' (its session expired or it left); join again"),
            )),
        }
    }
}

/// What a consumer learns when it joins.
pub struct Joined {
    pub consumer: u64,
    pub spec: ConsumerGroupSpec,
    pub generation: u64,
}

fn not_found(name: &str) -> ServerError {
    ServerError::coded(
        ErrorCode::CONSUMER_GROUP_NOT_FOUND,
        format!("no consumer group named '{name}'"),
    )
}

fn invalid(why: String) -> ServerError {
    ServerError::coded(ErrorCode::INVALID_ARGUMENT, why)
}

/// Checks a spec for a new group and fills in its defaults.
fn normalize(mut spec: ConsumerGroupSpec) -> Result<ConsumerGroupSpec, ServerError> {
    check_name("consumer group", &spec.name, ErrorCode::INVALID_ARGUMENT)?;
    let (lo, hi) = SESSION_RANGE_MS;
    if !(lo..=hi).contains(&spec.session_ms) {
        return Err(invalid(format!(
            "session timeout {} ms is outside {lo}..={hi} ms",
            spec.session_ms
        )));
    }
    let (lo, hi) = VISIBILITY_RANGE_MS;
    if !(lo..=hi).contains(&spec.visibility_ms) {
        return Err(invalid(format!(
            "visibility timeout {} ms is outside {lo}..={hi} ms",
            spec.visibility_ms
        )));
    }
    if matches!(spec.start, StartPos::Committed | StartPos::Offset(_)) {
        return Err(invalid(
            "a consumer group starts at the beginning, the end or a timestamp".into(),
        ));
    }
    let shared = spec.mode == ConsumerGroupMode::Shared;
    match spec.max_deliveries {
        n if shared && n > 0 => {
            let name = spec.default_dead_letter();
            spec.dead_letter.get_or_insert(name);
        }
        n if n > 0 || spec.dead_letter.is_some() => {
            return Err(invalid(
                "max_deliveries and dead_letter apply to shared groups that set max_deliveries"
                    .into(),
            ))
        }
        _ => {}
    }
    if let Some(d) = &spec.dead_letter {
        check_topic_name(d).map_err(|e| invalid(format!("dead-letter topic: {}", e)))?;
        if *d == spec.topic {
            return Err(invalid(
                "the dead-letter topic cannot be the group's topic".into(),
            ));
        }
    }
    Ok(spec)
}

/// Each owner of a source partition writes its dead letters to a
/// dead-letter partition it hosts itself: an existing dead-letter topic
/// must have one on every member that owns a partition of the source.
fn check_dead_letter_placement(
    topic: &str,
    source: &[u32],
    dlq: &str,
    dlq_placement: &[u32],
) -> Result<(), ServerError> {
    for (p, member) in source.iter().enumerate() {
        if !dlq_placement.contains(member) {
            return Err(invalid(format!(
                "dead-letter topic '{dlq}' has no partition on member {member}, which owns partition {p} of topic '{topic}': each member writes dead letters to a dead-letter partition it hosts; leave dead_letter unset to have one placed like the source, or add partitions on member {member} (strom topic add-partitions {dlq} --count 1 --server {member})"
            )));
        }
    }
    Ok(())
}

impl Registry {
    /// Joins `spec.name`, creating the group if it does not exist. A later
    /// join naming another topic or mode is refused; other options of the
    /// stored spec win.
    pub async fn join_group(
        &self,
        spec: ConsumerGroupSpec,
        rejoin: Option<u64>,
        label: String,
    ) -> Result<Joined, ServerError> {
        if spec.mode == ConsumerGroupMode::Kafka {
            return Err(invalid(format!(
                "consumer group '{}': kafka groups are joined with a Kafka client through a Kafka listener (strom server --kafka-listen), not the native protocol",
                spec.name
            )));
        }
        let exists = self
            .inner
            .lock()
            .await
            .state
            .consumer_groups
            .contains_key(&spec.name);
        if !exists {
            self.create_group(spec.clone()).await?;
        }
        let mut inner = self.inner.lock().await;
        let meta = inner
            .state
            .consumer_groups
            .get(&spec.name)
            .ok_or_else(|| not_found(&spec.name))?;
        if meta.spec.topic != spec.topic || meta.spec.mode != spec.mode {
            return Err(ServerError::coded(
                ErrorCode::CONSUMER_GROUP_MISMATCH,
                format!(
                    "consumer group '{}' is a {} group of topic '{}', not a {} group of topic '{}'",
                    spec.name,
                    meta.spec.mode.as_str(),
                    meta.spec.topic,
                    spec.mode.as_str(),
                    spec.topic
                ),
            ));
        }
        let consumer = match rejoin {
            Some(c) if c > 0 && c < meta.next_consumer && !meta.consumers.contains_key(&c) => c,
            _ => meta.next_consumer,
        };
        let group = spec.name.clone();
        inner
            .commit(RegistryCommand::ConsumerGroup(GroupCommand::Joined {
                group: group.clone(),
                consumer,
                label: label.clone(),
            }))
            .await?;
        self.coord
            .lock()
            .last_seen
            .insert((group.clone(), consumer), Instant::now());
        let meta = &inner.state.consumer_groups[&group];
        tracing::info!(group = %group, consumer, label = %label, "consumer joined");
        Ok(Joined {
            consumer,
            spec: meta.spec.clone(),
            generation: meta.generation,
        })
    }

    /// Records a new group, after creating its dead-letter topic if needed.
    pub(super) async fn create_group(&self, spec: ConsumerGroupSpec) -> Result<(), ServerError> {
        let spec = normalize(spec)?;
        let (source, placement) = {
            let inner = self.inner.lock().await;
            let t = super::topics::topic(&inner, &spec.topic)?;
            (t.spec.clone(), t.placement.clone())
        };
        if let Some(dlq) = &spec.dead_letter {
            // Placed like the source, so each owner dead-letters locally.
            let mut d = TopicSpec::new(dlq.clone(), source.partitions);
            d.partition_type = source.partition_type;
            d.durability = source.durability;
            match self.create_placed(d, None, Some(placement.clone())).await {
                Err(e) if e.code() == ErrorCode::TOPIC_EXISTS => {
                    let inner = self.inner.lock().await;
                    let existing = super::topics::topic(&inner, dlq)?;
                    check_dead_letter_placement(&spec.topic, &placement, dlq, &existing.placement)?;
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        let mut inner = self.inner.lock().await;
        if inner.state.consumer_groups.contains_key(&spec.name) {
            return Ok(()); // created meanwhile by another join
        }
        let name = spec.name.clone();
        inner
            .commit(RegistryCommand::ConsumerGroup(GroupCommand::Create {
                spec,
            }))
            .await?;
        tracing::info!(group = %name, "consumer group created");
        Ok(())
    }

    pub async fn leave_group(&self, group: &str, consumer: u64) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        self.coord
            .lock()
            .last_seen
            .remove(&(group.to_string(), consumer));
        let meta = inner
            .state
            .consumer_groups
            .get(group)
            .ok_or_else(|| not_found(group))?;
        if !meta.consumers.contains_key(&consumer) {
            return Ok(());
        }
        inner
            .commit(RegistryCommand::ConsumerGroup(GroupCommand::Left {
                group: group.to_string(),
                consumer,
            }))
            .await?;
        tracing::info!(group = %group, consumer, "consumer left");
        Ok(())
    }

    /// Removes every consumer not heard from within its group's session.
    pub async fn expire_consumers(&self) -> usize {
        let mut inner = self.inner.lock().await;
        let now = Instant::now();
        let mut due = Vec::new();
        for (name, meta) in &inner.state.consumer_groups {
            let session = Duration::from_millis(u64::from(meta.spec.session_ms));
            let coord = self.coord.lock();
            for c in meta.consumers.keys() {
                let seen = coord.last_seen.get(&(name.clone(), *c));
                if seen.is_none_or(|t| now.duration_since(*t) > session) {
                    due.push((name.clone(), *c));
                }
            }
        }
        let mut expired = 0;
        for (group, consumer) in due {
            self.coord
                .lock()
                .last_seen
                .remove(&(group.clone(), consumer));
            let cmd = RegistryCommand::ConsumerGroup(GroupCommand::Left {
                group: group.clone(),
                consumer,
            });
            match inner.commit(cmd).await {
                Ok(()) => {
                    expired += 1;
                    tracing::info!(group = %group, consumer, "consumer session expired");
                }
                Err(e) => {
                    tracing::warn!(group = %group, consumer, error = %e, "could not expire a consumer")
                }
            }
        }
        expired
    }

    /// Gives every known consumer a full session (after a master restart
    /// or a stall, heartbeats could not be heard).
    pub(super) fn grant_sessions(coord: &mut Coordinator, inner: &Inner, now: Instant) {
        for (name, meta) in &inner.state.consumer_groups {
            for c in meta.consumers.keys() {
                coord.last_seen.insert((name.clone(), *c), now);
            }
        }
    }

    /// Pushes every consumer's last heartbeat forward by `by` (the master
    /// stalled, so it could not hear them).
    pub async fn extend_sessions(&self, by: Duration) {
        let mut coord = self.coord.lock();
        for t in coord.last_seen.values_mut() {
            *t += by;
        }
        coord.parts.extend_revocations(by);
    }

    /// The spec of group `name` as the registry created it, if it did
    /// (what a partition owner asks before opening a group's state).
    pub async fn group_spec(&self, name: &str) -> Option<ConsumerGroupSpec> {
        let inner = self.inner.lock().await;
        inner
            .state
            .consumer_groups
            .get(name)
            .map(|m| m.spec.clone())
    }

    pub async fn describe_group(&self, name: &str) -> Result<ConsumerGroupInfo, ServerError> {
        let inner = self.inner.lock().await;
        let meta = inner
            .state
            .consumer_groups
            .get(name)
            .ok_or_else(|| not_found(name))?;
        Ok(self.group_info(&inner, meta).await)
    }

    pub async fn list_groups(&self) -> Vec<ConsumerGroupInfo> {
        let inner = self.inner.lock().await;
        let mut out = Vec::new();
        for meta in inner.state.consumer_groups.values() {
            out.push(self.group_info(&inner, meta).await);
        }
        out
    }

    pub async fn delete_group(&self, name: &str) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let meta = inner
            .state
            .consumer_groups
            .get(name)
            .ok_or_else(|| not_found(name))?
            .clone();
        if meta.spec.mode == ConsumerGroupMode::Kafka {
            self.forget_kafka_group(name)?;
        }
        inner
            .commit(RegistryCommand::ConsumerGroup(GroupCommand::Delete {
                name: name.to_string(),
            }))
            .await?;
        self.coord.lock().last_seen.retain(|(g, _), _| g != name);
        if let Ok(t) = super::topics::topic(&inner, &meta.spec.topic) {
            let req = || Request::DropConsumerGroup {
                topic: meta.spec.topic.clone(),
                group: name.to_string(),
            };
            self.tell_owners(
                &inner,
                t,
                req,
                "member could not drop a deleted consumer group",
            )
            .await;
        }
        tracing::info!(group = %name, "consumer group deleted");
        Ok(())
    }

    /// The group's consumers, with when each was last heard from.
    fn consumers_info(&self, meta: &ConsumerGroupMeta) -> Vec<GroupConsumerInfo> {
        let now = Instant::now();
        let coord = self.coord.lock();
        meta.consumers
            .iter()
            .map(|(id, label)| {
                let seen = coord.last_seen.get(&(meta.spec.name.clone(), *id));
                GroupConsumerInfo {
                    id: *id,
                    label: label.clone(),
                    alive: seen.is_some(),
                    last_seen_ms: seen.map_or(0, |t| now.duration_since(*t).as_millis() as u64),
                    partitions: meta
                        .assignment
                        .iter()
                        .filter(|(_, (c, _))| c == id)
                        .map(|(p, _)| *p)
                        .collect(),
                }
            })
            .collect()
    }

    /// The group's members and, from each owner, its partitions' state.
    async fn group_info(&self, inner: &Inner, meta: &ConsumerGroupMeta) -> ConsumerGroupInfo {
        let (consumers, generation) = match meta.spec.mode {
            ConsumerGroupMode::Kafka => self.kafka_members(&meta.spec.name),
            _ => (self.consumers_info(meta), meta.generation),
        };
        let mut partitions = Vec::new();
        if let Ok(t) = super::topics::topic(inner, &meta.spec.topic) {
            for (member, parts) in t.by_member() {
                let req = Request::ConsumerGroupStats {
                    spec: meta.spec.clone(),
                    partitions: parts.clone(),
                };
                let addr = inner.addr_of(member);
                match self.link.call(member, &addr, req).await {
                    Ok(Response::GroupStats(stats)) => partitions.extend(stats),
                    other => {
                        let why = match other {
                            Err(e) => e.to_string(),
                            Ok(r) => format!("unexpected answer {}", r.opcode()),
                        };
                        partitions.extend(parts.iter().map(|p| GroupPartitionInfo {
                            partition: *p,
                            member,
                            status: PartitionStatus::Unavailable(format!(
                                "member {member} at {addr}: {why}"
                            )),
                            ..Default::default()
                        }));
                    }
                }
            }
        }
        partitions.sort_by_key(|p| p.partition);
        for p in &mut partitions {
            p.holder = meta.assignment.get(&p.partition).copied().or_else(|| {
                let c = consumers
                    .iter()
                    .find(|c| c.partitions.contains(&p.partition))?;
                Some((c.id, generation))
            });
        }
        ConsumerGroupInfo {
            spec: meta.spec.clone(),
            generation,
            consumers,
            ended: super::coordinator::group_ended(inner, meta),
            partitions,
        }
    }
}
