//! The topic registry (master database), held by member 0 of a group:
//! topics with their specs and policies, where each partition lives,
//! end-of-stream bookkeeping (registered and closed producers), and the
//! group's members with their last heartbeat. It persists to
//! `registry.json`, rewritten atomically after every change. Control-plane
//! operations are serialized by one async lock; the data path never takes it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strom_proto::{
    ErrorCode, GroupFile, GroupMember, MemberInfo, PartitionInfo, PartitionStatus, Request,
    Response, TopicInfo, TopicSpec, TopicState,
};
use tokio::sync::Mutex;

use crate::error::ServerError;
use crate::group::{read_json_or_default, write_group_file, write_json};
use crate::host::check_topic_name;
use crate::members::MemberLink;

const MAX_PARTITIONS: u32 = 65_536;
/// A member not heard from for this long is reported dead.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Serialize, Deserialize, Clone)]
struct TopicMeta {
    id: u64,
    spec: TopicSpec,
    /// Member id owning each partition.
    placement: Vec<u32>,
    /// producer id -> closed
    producers: BTreeMap<u64, bool>,
    next_producer: u64,
    completed: bool,
}

impl TopicMeta {
    fn state(&self) -> TopicState {
        let closed = self.producers.values().filter(|c| **c).count() as u32;
        let open = self.producers.len() as u32 - closed;
        TopicState {
            open_producers: open,
            closed_producers: closed,
            ended: self.completed || (open == 0 && closed > 0),
        }
    }

    /// Member -> partitions it owns.
    fn by_member(&self) -> BTreeMap<u32, Vec<u32>> {
        let mut m: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (p, member) in self.placement.iter().enumerate() {
            m.entry(*member).or_default().push(p as u32);
        }
        m
    }
}

#[derive(Serialize, Deserialize, Default)]
struct Persisted {
    /// The group's id, chosen at the master's first start (0 in old files).
    #[serde(default)]
    group_id: u64,
    next_topic_id: u64,
    topics: Vec<TopicMeta>,
    members: Vec<GroupMember>,
}

struct Member {
    addr: String,
    last_seen: Instant,
}

struct RegState {
    next_topic_id: u64,
    topics: BTreeMap<String, TopicMeta>,
    members: BTreeMap<u32, Member>,
}

pub struct Registry {
    file: PathBuf,
    /// Reaches members (this server included) for host/seal/drop/stats.
    link: Arc<MemberLink>,
    group_id: u64,
    group_file: Option<PathBuf>,
    /// Members expected before the group file is first written (launcher size).
    expected: u32,
    state: Mutex<RegState>,
}

fn not_found(name: &str) -> ServerError {
    ServerError::coded(
        ErrorCode::TOPIC_NOT_FOUND,
        format!("no topic named '{name}'"),
    )
}

impl Registry {
    pub fn open(
        data_dir: &std::path::Path,
        group_file: Option<PathBuf>,
        expected: u32,
        link: Arc<MemberLink>,
    ) -> Result<Self, ServerError> {
        let addr = link.addr().to_string();
        let file = data_dir.join("registry.json");
        let p: Persisted = read_json_or_default(&file)?;
        let group_id = if p.group_id != 0 {
            p.group_id
        } else {
            new_group_id()
        };
        let now = Instant::now();
        let mut members: BTreeMap<u32, Member> = p
            .members
            .into_iter()
            .map(|m| {
                // Known members count as dead until they heartbeat again.
                let seen = now.checked_sub(HEARTBEAT_TIMEOUT * 2).unwrap_or(now);
                (
                    m.id,
                    Member {
                        addr: m.addr,
                        last_seen: seen,
                    },
                )
            })
            .collect();
        members.insert(
            0,
            Member {
                addr: addr.to_string(),
                last_seen: now,
            },
        );
        let registry = Registry {
            file,
            link,
            group_id,
            group_file,
            expected: expected.max(1),
            state: Mutex::new(RegState {
                next_topic_id: p.next_topic_id,
                topics: p
                    .topics
                    .into_iter()
                    .map(|t| (t.spec.name.clone(), t))
                    .collect(),
                members,
            }),
        };
        if p.group_id != group_id {
            // Record the new id before any group file carries it.
            registry.persist(&registry.state.try_lock().expect("not shared yet"))?;
        }
        Ok(registry)
    }

    /// The group's id, written into the group file.
    pub fn group_id(&self) -> u64 {
        self.group_id
    }

    fn group_members(st: &RegState) -> Vec<GroupMember> {
        st.members
            .iter()
            .map(|(id, m)| GroupMember {
                id: *id,
                addr: m.addr.clone(),
            })
            .collect()
    }

    fn persist(&self, st: &RegState) -> Result<(), ServerError> {
        let p = Persisted {
            group_id: self.group_id,
            next_topic_id: st.next_topic_id,
            topics: st.topics.values().cloned().collect(),
            members: Self::group_members(st),
        };
        write_json(&self.file, &p)
    }

    /// Writes the group file once the expected members have all joined.
    fn publish_group(&self, st: &RegState) {
        let Some(path) = &self.group_file else { return };
        if (st.members.len() as u32) < self.expected {
            return;
        }
        let g = GroupFile {
            members: Self::group_members(st),
            master: 0,
            group_id: self.group_id,
        };
        if let Err(e) = write_group_file(path, &g) {
            tracing::error!(path = %path.display(), error = %e, "cannot write the group file");
        }
    }

    pub async fn publish_initial(&self) {
        let st = self.state.lock().await;
        self.publish_group(&st);
    }

    fn alive(id: u32, m: &Member) -> bool {
        id == 0 || m.last_seen.elapsed() < HEARTBEAT_TIMEOUT
    }

    pub async fn members(&self) -> Vec<MemberInfo> {
        let st = self.state.lock().await;
        st.members
            .iter()
            .map(|(id, m)| MemberInfo {
                id: *id,
                addr: m.addr.clone(),
                alive: Self::alive(*id, m),
                last_seen_ms: if *id == 0 {
                    0
                } else {
                    m.last_seen.elapsed().as_millis() as u64
                },
            })
            .collect()
    }

    /// Admits a member (or a restarted one under its old id); returns its id.
    pub async fn join(&self, want: Option<u32>, addr: String) -> Result<u32, ServerError> {
        let mut st = self.state.lock().await;
        let id = match want {
            Some(0) => {
                return Err(ServerError::coded(
                    ErrorCode::INVALID_ARGUMENT,
                    "member id 0 is the registry master; a joining server cannot take it",
                ))
            }
            Some(id) => id,
            None => st.members.keys().max().map_or(1, |m| m + 1),
        };
        st.members.insert(
            id,
            Member {
                addr: addr.clone(),
                last_seen: Instant::now(),
            },
        );
        self.persist(&st)?;
        self.publish_group(&st);
        tracing::info!(member = id, addr = %addr, "member joined");
        // Re-send what the member should host (a restarted member may have
        // missed a seal or a new partition while it was down).
        let work: Vec<Request> = st
            .topics
            .values()
            .filter_map(|t| {
                let parts = t.by_member().remove(&id)?;
                Some(Request::HostPartitions {
                    topic_id: t.id,
                    spec: t.spec.clone(),
                    partitions: parts,
                    sealed: t.state().ended,
                })
            })
            .collect();
        drop(st);
        let link = self.link.clone();
        tokio::spawn(async move {
            for req in work {
                if let Err(e) = link.call(id, &addr, req).await {
                    tracing::warn!(member = id, error = %e, "re-hosting partitions on a rejoined member failed");
                }
            }
        });
        Ok(id)
    }

    pub async fn heartbeat(&self, member: u32, addr: String) -> Result<(), ServerError> {
        let mut st = self.state.lock().await;
        let Some(m) = st.members.get_mut(&member) else {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("member {member} is not part of this group; join first"),
            ));
        };
        m.last_seen = Instant::now();
        if m.addr != addr {
            m.addr = addr;
            self.persist(&st)?;
            self.publish_group(&st);
        }
        Ok(())
    }

    fn addr_of(st: &RegState, member: u32) -> String {
        st.members
            .get(&member)
            .map(|m| m.addr.clone())
            .unwrap_or_default()
    }

    /// Chooses owners for `count` new partitions starting at index `first`.
    fn place(
        st: &RegState,
        count: u32,
        first: u64,
        member: Option<u32>,
    ) -> Result<Vec<u32>, ServerError> {
        if let Some(m) = member {
            match st.members.get(&m) {
                Some(x) if Self::alive(m, x) => return Ok(vec![m; count as usize]),
                Some(_) => {
                    return Err(ServerError::coded(
                        ErrorCode::CONNECTION_FAILED,
                        format!("member {m} is not alive; cannot place partitions on it"),
                    ))
                }
                None => {
                    return Err(ServerError::coded(
                        ErrorCode::INVALID_ARGUMENT,
                        format!("there is no member {m} in this group"),
                    ))
                }
            }
        }
        let alive: Vec<u32> = st
            .members
            .iter()
            .filter(|(id, m)| Self::alive(**id, m))
            .map(|(id, _)| *id)
            .collect();
        Ok((0..count as u64)
            .map(|i| alive[((first + i) % alive.len() as u64) as usize])
            .collect())
    }

    /// Asks each owner to host its partitions; undoes nothing on failure
    /// (hosting is idempotent and dropped with the topic).
    async fn host_on_members(
        &self,
        st: &RegState,
        meta: &TopicMeta,
        only: impl Fn(u32) -> bool,
    ) -> Result<(), ServerError> {
        for (member, parts) in meta.by_member() {
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
            self.link
                .call(member, &Self::addr_of(st, member), req)
                .await
                .map_err(|e| ServerError::coded(e.code(), format!("member {member}: {e}")))?;
        }
        Ok(())
    }

    pub async fn create(
        &self,
        spec: TopicSpec,
        member: Option<u32>,
    ) -> Result<TopicInfo, ServerError> {
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
        let mut st = self.state.lock().await;
        if st.topics.contains_key(&spec.name) {
            return Err(ServerError::coded(
                ErrorCode::TOPIC_EXISTS,
                format!("topic '{}' already exists", spec.name),
            ));
        }
        let id = st.next_topic_id;
        let meta = TopicMeta {
            id,
            placement: Self::place(&st, spec.partitions, id, member)?,
            spec,
            producers: BTreeMap::new(),
            next_producer: 1,
            completed: false,
        };
        st.next_topic_id += 1;
        if let Err(e) = self.host_on_members(&st, &meta, |_| true).await {
            for m in meta.by_member().keys() {
                let req = Request::DropPartitions {
                    topic: meta.spec.name.clone(),
                };
                let _ = self.link.call(*m, &Self::addr_of(&st, *m), req).await;
            }
            return Err(e);
        }
        st.topics.insert(meta.spec.name.clone(), meta.clone());
        self.persist(&st)?;
        tracing::info!(topic = %meta.spec.name, partitions = meta.spec.partitions, "topic created");
        let info = self.info(&st, &meta, true).await;
        Ok(info)
    }

    /// The topic's description, with offsets fetched from each owner.
    async fn info(&self, st: &RegState, meta: &TopicMeta, offsets: bool) -> TopicInfo {
        let mut partitions: Vec<PartitionInfo> = meta
            .placement
            .iter()
            .enumerate()
            .map(|(p, m)| PartitionInfo {
                id: p as u32,
                member: *m,
                addr: Self::addr_of(st, *m),
                first_offset: 0,
                next_offset: 0,
                status: Default::default(),
                dropped_events: 0,
            })
            .collect();
        for (member, parts) in meta.by_member().into_iter().filter(|_| offsets) {
            let req = Request::PartitionStats {
                topic: meta.spec.name.clone(),
                partitions: parts.clone(),
            };
            match self
                .link
                .call(member, &Self::addr_of(st, member), req)
                .await
            {
                Ok(Response::Stats(stats)) => {
                    for p in &parts {
                        partitions[*p as usize].status = PartitionStatus::Unavailable(format!(
                            "member {member} at {} does not serve it",
                            Self::addr_of(st, member)
                        ));
                    }
                    for s in stats {
                        if let Some(p) = partitions.get_mut(s.id as usize) {
                            p.first_offset = s.first_offset;
                            p.next_offset = s.next_offset;
                            p.status = s.status;
                            p.dropped_events = s.dropped_events;
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(member, error = %e, "no partition stats from member");
                    for p in &parts {
                        partitions[*p as usize].status = PartitionStatus::Unavailable(format!(
                            "member {member} at {} is down or unreachable",
                            Self::addr_of(st, member)
                        ));
                    }
                }
            }
        }
        TopicInfo {
            spec: meta.spec.clone(),
            partitions,
            state: meta.state(),
        }
    }

    pub async fn describe(&self, name: &str, offsets: bool) -> Result<TopicInfo, ServerError> {
        let st = self.state.lock().await;
        let meta = st.topics.get(name).ok_or_else(|| not_found(name))?;
        Ok(self.info(&st, meta, offsets).await)
    }

    pub async fn list(&self) -> Vec<TopicInfo> {
        let st = self.state.lock().await;
        let mut out = Vec::new();
        for meta in st.topics.values() {
            out.push(self.info(&st, meta, true).await);
        }
        out
    }

    pub async fn delete(&self, name: &str) -> Result<(), ServerError> {
        let mut st = self.state.lock().await;
        let meta = st.topics.remove(name).ok_or_else(|| not_found(name))?;
        if let Err(e) = self.persist(&st) {
            st.topics.insert(name.to_string(), meta);
            return Err(e);
        }
        for m in meta.by_member().keys() {
            let req = Request::DropPartitions {
                topic: name.to_string(),
            };
            if let Err(e) = self.link.call(*m, &Self::addr_of(&st, *m), req).await {
                tracing::warn!(member = m, topic = %name, error = %e, "member could not drop a deleted topic's partitions");
            }
        }
        tracing::info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// Applies a change to a topic, persists it, and seals every partition
    /// if the stream has just ended.
    async fn update<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut TopicMeta) -> Result<T, ServerError>,
    ) -> Result<T, ServerError> {
        let mut st = self.state.lock().await;
        let meta = st.topics.get_mut(name).ok_or_else(|| not_found(name))?;
        let before = meta.clone();
        let out = f(meta)?;
        let ended_now = !before.state().ended && meta.state().ended;
        let meta = meta.clone();
        if let Err(e) = self.persist(&st) {
            st.topics.insert(name.to_string(), before);
            return Err(e);
        }
        if ended_now {
            for m in meta.by_member().keys() {
                let req = Request::SealPartitions {
                    topic: name.to_string(),
                };
                if let Err(e) = self.link.call(*m, &Self::addr_of(&st, *m), req).await {
                    // The member re-seals when it rejoins (see `join`).
                    tracing::warn!(member = m, topic = %name, error = %e, "could not seal partitions on a member");
                }
            }
        }
        Ok(out)
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

    pub async fn register_producer(&self, topic: &str) -> Result<u64, ServerError> {
        self.update(topic, |m| {
            Self::check_open(m)?;
            let id = m.next_producer;
            m.next_producer += 1;
            m.producers.insert(id, false);
            Ok(id)
        })
        .await
    }

    pub async fn close_producer(&self, topic: &str, producer: u64) -> Result<(), ServerError> {
        self.update(topic, |m| match m.producers.get_mut(&producer) {
            Some(closed) => {
                *closed = true;
                Ok(())
            }
            None => Err(ServerError::coded(
                ErrorCode::PRODUCER_NOT_FOUND,
                format!("topic '{topic}' has no producer {producer}"),
            )),
        })
        .await
    }

    pub async fn complete(&self, topic: &str) -> Result<(), ServerError> {
        self.update(topic, |m| {
            m.completed = true;
            Ok(())
        })
        .await
    }

    pub async fn add_partitions(
        &self,
        topic: &str,
        count: u32,
        member: Option<u32>,
    ) -> Result<TopicInfo, ServerError> {
        let mut st = self.state.lock().await;
        let meta = st
            .topics
            .get(topic)
            .ok_or_else(|| not_found(topic))?
            .clone();
        Self::check_open(&meta)?;
        let old = meta.spec.partitions;
        if count == 0 || old as u64 + count as u64 > MAX_PARTITIONS as u64 {
            return Err(ServerError::coded(
                ErrorCode::INVALID_ARGUMENT,
                format!("cannot add {count} partitions to a topic of {old} (the limit is {MAX_PARTITIONS})"),
            ));
        }
        let mut new = meta.clone();
        new.placement
            .extend(Self::place(&st, count, meta.id + old as u64, member)?);
        new.spec.partitions = old + count;
        self.host_on_members(&st, &new, |p| p >= old).await?;
        st.topics.insert(topic.to_string(), new.clone());
        self.persist(&st)?;
        tracing::info!(topic = %topic, added = count, "partitions added");
        Ok(self.info(&st, &new, true).await)
    }
}

/// A random non-zero group id (no RNG dependency: clock, pid and a hash).
fn new_group_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish().max(1)
}
