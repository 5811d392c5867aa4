//! The registry's topic operations: create, describe, list, delete, add
//! partitions, and the end-of-stream bookkeeping (register and close
//! producers, complete). Each validates against the current state, makes
//! its choices (ids, placement), calls the members that must act first,
//! and then commits one command; the member calls that follow a change
//! (seal at end of stream, drop on delete) come after the commit.

use strom_proto::{ErrorCode, PartitionType, Request, TopicInfo, TopicSpec};

use super::describe::Described;
use super::machine::{RegistryCommand, TopicMeta, MAX_PARTITIONS};
use super::replica_machine::ReplicaSet;
use super::{Inner, Registry};
use crate::error::ServerError;
use crate::names::check_topic_name;

fn not_found(name: &str) -> ServerError {
    ServerError::coded(
        ErrorCode::TOPIC_NOT_FOUND,
        format!("no topic named '{name}'"),
    )
}

pub(super) fn topic<'a>(inner: &'a Inner, name: &str) -> Result<&'a TopicMeta, ServerError> {
    inner.state.topics.get(name).ok_or_else(|| not_found(name))
}

fn check_open(meta: &TopicMeta) -> Result<(), ServerError> {
    if meta.state().ended {
        return Err(ServerError::coded(
            ErrorCode::TOPIC_CLOSED,
            format!(
                "topic '{}' has ended; it accepts no new producers",
                meta.spec.name
            ),
        ));
    }
    Ok(())
}

/// Chooses owners for `count` new partitions starting at index `first`:
/// round-robin over live members, or all on `member`.
fn place(
    inner: &Inner,
    count: u32,
    first: u64,
    member: Option<u32>,
) -> Result<Vec<u32>, ServerError> {
    if let Some(m) = member {
        return match inner.state.members.get(&m) {
            Some(_) if inner.alive(m) => Ok(vec![m; count as usize]),
            Some(_) => Err(ServerError::coded(
                ErrorCode::CONNECTION_FAILED,
                format!("member {m} is not alive; cannot place partitions on it"),
            )),
            None => Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("there is no member {m} in this group"),
            )),
        };
    }
    let alive = inner.live_members();
    Ok((0..count as u64)
        .map(|i| alive[((first + i) % alive.len() as u64) as usize])
        .collect())
}

fn check_spec(spec: &TopicSpec) -> Result<(), ServerError> {
    check_topic_name(&spec.name)?;
    if spec.partitions == 0 || spec.partitions > MAX_PARTITIONS {
        return Err(ServerError::coded(
            ErrorCode::INVALID_TOPIC_SPEC,
            format!(
                "a topic needs 1 to {MAX_PARTITIONS} partitions, not {}",
                spec.partitions
            ),
        ));
    }
    if spec.segment_bytes.is_some_and(|s| s < 4096) {
        return Err(ServerError::coded(
            ErrorCode::INVALID_TOPIC_SPEC,
            "segment_bytes must be at least 4096",
        ));
    }
    strom_policy::TopicPolicy::new(
        &spec.validator,
        spec.schema.as_deref(),
        &spec.selector,
        &spec.serializer,
    )
    .map_err(|e| ServerError::coded(ErrorCode::BAD_POLICY_SPEC, e.to_string()))?;
    strom_proto::Compression::parse(&spec.compression)
        .map_err(|e| ServerError::coded(ErrorCode::INVALID_TOPIC_SPEC, e))?;
    Ok(())
}

impl Registry {
    /// Asks each owner to host its partitions; undoes nothing on failure
    /// (hosting is idempotent and dropped with the topic).
    async fn host_on_members(
        &self,
        inner: &Inner,
        meta: &TopicMeta,
        only: impl Fn(u32) -> bool,
    ) -> Result<(), ServerError> {
        for (member, parts) in meta.holders() {
            let parts: Vec<u32> = parts.into_iter().filter(|p| only(*p)).collect();
            if parts.is_empty() {
                continue;
            }
            let req = Request::HostPartitions {
                topic_id: meta.id,
                spec: meta.spec.clone(),
                partitions: parts,
                sealed: meta.state().ended,
            };
            let addr = inner.addr_of(member);
            let mut sent = self.link.call(member, &addr, req.clone()).await;
            // A member that was paused may have been slow to answer on its
            // old connection (dropped after a timeout): hosting is
            // idempotent, so one more try goes out on a new connection.
            if sent.as_ref().is_err_and(|e| lost_connection(e.code())) {
                tracing::warn!(member, topic = %meta.spec.name, "hosting partitions: the member's connection was lost; asking once more");
                sent = self.link.call(member, &addr, req).await;
            }
            sent.map_err(|e| ServerError::coded(e.code(), format!("member {member}: {e}")))?;
        }
        Ok(())
    }

    /// Sends `req(topic)` to every owner of the topic's partitions, logging
    /// (not returning) failures: `what` says what could not be done.
    pub(super) async fn tell_owners(
        &self,
        inner: &Inner,
        meta: &TopicMeta,
        req: impl Fn() -> Request,
        what: &str,
    ) {
        for m in meta.holders().keys() {
            if let Err(e) = self.link.call(*m, &inner.addr_of(*m), req()).await {
                tracing::warn!(member = m, topic = %meta.spec.name, error = %e, "{what}");
            }
        }
    }

    pub async fn create(
        &self,
        spec: TopicSpec,
        member: Option<u32>,
    ) -> Result<TopicInfo, ServerError> {
        self.create_placed(spec, member, None).await
    }

    /// Creates a topic whose partition `p` lives where `like[p]` says (a
    /// dead-letter topic placed like its source), or as [`Self::create`] does.
    pub(super) async fn create_placed(
        &self,
        spec: TopicSpec,
        member: Option<u32>,
        like: Option<Vec<u32>>,
    ) -> Result<TopicInfo, ServerError> {
        check_spec(&spec)?;
        let mut inner = self.inner.lock().await;
        if inner.state.topics.contains_key(&spec.name) {
            return Err(ServerError::coded(
                ErrorCode::TOPIC_EXISTS,
                format!("topic '{}' already exists", spec.name),
            ));
        }
        let id = inner.state.next_topic_id.max(inner.topic_id_floor);
        if spec.replicas() > 1 && member.is_some() {
            return Err(ServerError::coded(
                ErrorCode::INVALID_TOPIC_SPEC,
                "a replicated topic's copies go on distinct members; it cannot be placed on one",
            ));
        }
        if spec.replicas() > 1
            && spec.partition_type == PartitionType::Memory
            && self.quorum.is_none()
        {
            return Err(ServerError::coded(
                ErrorCode::INVALID_TOPIC_SPEC,
                format!(
                    "topic '{}': a replicated memory topic needs a metadata quorum (start the \
                     group with --meta-voters 3; strom cluster up does from three servers): \
                     without one, member 0 keeps the registry itself, and when it restarts it \
                     leads its partitions again with an empty log, losing what they held; use a \
                     file topic here",
                    spec.name
                ),
            ));
        }
        let placement = match like {
            Some(like) if like.len() == spec.partitions as usize => like,
            _ => place(&inner, spec.partitions, id, member)?,
        };
        let replicas = super::replicas::place(&inner, &spec, &placement)?;
        let meta = TopicMeta {
            id,
            placement,
            replicas,
            spec,
            producers: Default::default(),
            next_producer: 1,
            completed: false,
            leases: Default::default(),
            expired: Default::default(),
        };
        inner.topic_id_floor = id + 1;
        let drop_req = || Request::DropPartitions {
            topic: meta.spec.name.clone(),
        };
        if let Err(e) = self.host_on_members(&inner, &meta, |_| true).await {
            self.tell_owners(
                &inner,
                &meta,
                drop_req,
                "member could not drop the partitions of a failed create",
            )
            .await;
            return Err(e);
        }
        if let Err(e) = inner
            .commit(RegistryCommand::CreateTopic {
                meta: Box::new(meta.clone()),
            })
            .await
        {
            self.tell_owners(
                &inner,
                &meta,
                drop_req,
                "member could not drop the partitions of a create that was not recorded",
            )
            .await;
            return Err(e);
        }
        tracing::info!(topic = %meta.spec.name, partitions = meta.spec.partitions, replicas = meta.spec.replicas(), "topic created");
        let calls = super::replicas::role_calls(&inner, &meta, None);
        let d = Described::of(&inner, &meta, true);
        drop(inner);
        self.send_roles(calls).await;
        Ok(self.with_stats(vec![d]).await.remove(0))
    }

    pub async fn describe(&self, name: &str, offsets: bool) -> Result<TopicInfo, ServerError> {
        let inner = self.inner.lock().await;
        let d = Described::of(&inner, topic(&inner, name)?, offsets);
        drop(inner);
        Ok(self.with_stats(vec![d]).await.remove(0))
    }

    pub async fn list(&self) -> Vec<TopicInfo> {
        let inner = self.inner.lock().await;
        let all = inner
            .state
            .topics
            .values()
            .map(|meta| Described::of(&inner, meta, true))
            .collect();
        drop(inner);
        self.with_stats(all).await
    }

    pub async fn delete(&self, name: &str) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let meta = topic(&inner, name)?.clone();
        inner
            .commit(RegistryCommand::DeleteTopic {
                name: name.to_string(),
            })
            .await?;
        let drop_req = || Request::DropPartitions {
            topic: name.to_string(),
        };
        self.tell_owners(
            &inner,
            &meta,
            drop_req,
            "member could not drop a deleted topic's partitions",
        )
        .await;
        tracing::info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// Commits a change to a topic's end-of-stream bookkeeping and seals
    /// every partition if the stream has just ended.
    pub(super) async fn commit_and_seal(
        &self,
        inner: &mut Inner,
        name: &str,
        cmd: RegistryCommand,
    ) -> Result<(), ServerError> {
        let ended_before = topic(inner, name)?.state().ended;
        inner.commit(cmd).await?;
        let meta = topic(inner, name)?;
        if !ended_before && meta.state().ended {
            let seal = || Request::SealPartitions {
                topic: name.to_string(),
            };
            // A member that misses it re-seals when it rejoins (see `join`).
            self.tell_owners(inner, meta, seal, "could not seal partitions on a member")
                .await;
        }
        Ok(())
    }

    /// The id the next producer of an open topic takes.
    pub(super) fn next_producer(&self, inner: &Inner, name: &str) -> Result<u64, ServerError> {
        let meta = topic(inner, name)?;
        check_open(meta)?;
        Ok(meta.next_producer)
    }

    /// Registers a producer without a lease: it stays open until closed.
    pub async fn register_producer(&self, name: &str) -> Result<u64, ServerError> {
        let mut inner = self.inner.lock().await;
        let producer = self.next_producer(&inner, name)?;
        inner
            .commit(RegistryCommand::RegisterProducer {
                topic: name.to_string(),
                producer,
                lease_ms: None,
            })
            .await?;
        Ok(producer)
    }

    pub async fn close_producer(&self, name: &str, producer: u64) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let meta = topic(&inner, name)?;
        if !meta.producers.contains_key(&producer) {
            return Err(ServerError::coded(
                ErrorCode::PRODUCER_NOT_FOUND,
                format!("topic '{name}' has no producer {producer}"),
            ));
        }
        Registry::check_not_expired(meta, producer)?;
        inner.lease_deadline.remove(&(name.to_string(), producer));
        let cmd = RegistryCommand::CloseProducer {
            topic: name.to_string(),
            producer,
        };
        self.commit_and_seal(&mut inner, name, cmd).await
    }

    pub async fn complete(&self, name: &str) -> Result<(), ServerError> {
        let mut inner = self.inner.lock().await;
        let cmd = RegistryCommand::CompleteTopic {
            topic: name.to_string(),
        };
        self.commit_and_seal(&mut inner, name, cmd).await
    }

    pub async fn add_partitions(
        &self,
        name: &str,
        count: u32,
        member: Option<u32>,
    ) -> Result<TopicInfo, ServerError> {
        let mut inner = self.inner.lock().await;
        let meta = topic(&inner, name)?;
        check_open(meta)?;
        let old = meta.spec.partitions;
        if count == 0 || old as u64 + count as u64 > MAX_PARTITIONS as u64 {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("cannot add {count} partitions to a topic of {old} (the limit is {MAX_PARTITIONS})"),
            ));
        }
        let placement = place(&inner, count, meta.id + old as u64, member)?;
        // A topic with replica sets (replicated, or one whose partitions
        // moved) gets one for each new partition too.
        let replicas = match (meta.replicas.is_empty(), meta.spec.replicas()) {
            (true, _) => Vec::new(),
            (false, 1) => placement.iter().map(|m| ReplicaSet::one(*m)).collect(),
            (false, _) => super::replicas::place(&inner, &meta.spec, &placement)?,
        };
        let mut grown = meta.clone();
        grown.placement.extend_from_slice(&placement);
        grown.replicas.extend_from_slice(&replicas);
        grown.spec.partitions = old + count;
        self.host_on_members(&inner, &grown, |p| p >= old).await?;
        inner
            .commit(RegistryCommand::AddPartitions {
                topic: name.to_string(),
                placement,
                replicas,
            })
            .await?;
        tracing::info!(topic = %name, added = count, "partitions added");
        let meta = topic(&inner, name)?;
        let roles = super::replicas::role_calls(&inner, meta, None);
        let d = Described::of(&inner, meta, true);
        drop(inner);
        self.send_roles(roles).await;
        Ok(self.with_stats(vec![d]).await.remove(0))
    }
}

/// Whether a call to a member failed because its connection did.
fn lost_connection(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::CONNECTION_FAILED | ErrorCode::CONNECTION_CLOSED | ErrorCode::TIMEOUT
    )
}
