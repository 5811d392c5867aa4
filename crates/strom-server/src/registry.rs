//! The topic registry (master database): topics, their specs and policies,
//! partition placement, and end-of-stream bookkeeping (registered and closed
//! producers). It persists to `registry.json` in the data directory, rewritten
//! atomically after every change; restart loads it and reopens every
//! partition through the same code path as a fresh start.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strom_proto::{ErrorCode, PartitionInfo, TopicInfo, TopicSpec, TopicState};

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::group::write_atomic;
use crate::partition::PartitionManager;

const MAX_PARTITIONS: u32 = 65_536;

#[derive(Serialize, Deserialize, Default)]
struct Persisted {
    next_topic_id: u64,
    topics: Vec<PersistedTopic>,
}

#[derive(Serialize, Deserialize, Clone)]
struct PersistedTopic {
    id: u64,
    spec: TopicSpec,
    /// producer id -> closed
    producers: BTreeMap<u64, bool>,
    next_producer: u64,
    completed: bool,
}

pub struct Topic {
    meta: Mutex<PersistedTopic>,
    pub partitions: Vec<Arc<PartitionManager>>,
}

impl Topic {
    pub fn spec(&self) -> TopicSpec {
        self.meta.lock().spec.clone()
    }

    fn state(meta: &PersistedTopic) -> TopicState {
        let closed = meta.producers.values().filter(|c| **c).count() as u32;
        let open = meta.producers.len() as u32 - closed;
        TopicState {
            open_producers: open,
            closed_producers: closed,
            ended: meta.completed || (open == 0 && closed > 0),
        }
    }
}

pub struct Registry {
    file: PathBuf,
    topics_dir: PathBuf,
    config: ServerConfig,
    member: u32,
    addr: String,
    inner: Mutex<(u64, BTreeMap<String, Arc<Topic>>)>,
}

/// Topic names become directory names: keep them to a safe alphabet.
pub fn check_topic_name(name: &str) -> Result<(), ServerError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ServerError::coded(
            ErrorCode::INVALID_TOPIC_SPEC,
            format!("invalid topic name '{name}': use 1-200 characters from [A-Za-z0-9._-]"),
        ))
    }
}

impl Registry {
    pub fn open(config: &ServerConfig, member: u32, addr: String) -> Result<Self, ServerError> {
        let file = config.data_dir.join("registry.json");
        let topics_dir = config.data_dir.join("topics");
        std::fs::create_dir_all(&topics_dir)
            .map_err(|e| ServerError::io(format!("creating {}", topics_dir.display()), e))?;
        let persisted: Persisted = match std::fs::read(&file) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                ServerError::coded(
                    ErrorCode::CORRUPT,
                    format!("registry {} is not valid: {e}", file.display()),
                )
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Persisted::default(),
            Err(e) => return Err(ServerError::io(format!("reading {}", file.display()), e)),
        };
        let reg = Registry {
            file,
            topics_dir,
            config: config.clone(),
            member,
            addr,
            inner: Mutex::new((persisted.next_topic_id, BTreeMap::new())),
        };
        for t in persisted.topics {
            let topic = reg.open_topic(t)?;
            let name = topic.spec().name;
            reg.inner.lock().1.insert(name, topic);
        }
        Ok(reg)
    }

    fn topic_dir(&self, id: u64, name: &str) -> PathBuf {
        self.topics_dir.join(format!("{name}.{id}"))
    }

    fn open_topic(&self, meta: PersistedTopic) -> Result<Arc<Topic>, ServerError> {
        let dir = self.topic_dir(meta.id, &meta.spec.name);
        let ended = Topic::state(&meta).ended;
        let partitions = (0..meta.spec.partitions)
            .map(|p| {
                PartitionManager::open(&meta.spec, p, &dir.join(p.to_string()), &self.config, ended)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Topic {
            meta: Mutex::new(meta),
            partitions,
        }))
    }

    fn persist(
        &self,
        topics: &BTreeMap<String, Arc<Topic>>,
        next_topic_id: u64,
    ) -> Result<(), ServerError> {
        let p = Persisted {
            next_topic_id,
            topics: topics.values().map(|t| t.meta.lock().clone()).collect(),
        };
        let bytes = serde_json::to_vec_pretty(&p)
            .map_err(|e| ServerError::io("encoding the registry", std::io::Error::other(e)))?;
        write_atomic(&self.file, &bytes)
    }

    pub fn create(&self, spec: TopicSpec) -> Result<TopicInfo, ServerError> {
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
        strom_policy::TopicPolicy::new(
            &spec.validator,
            spec.schema.as_deref(),
            &spec.selector,
            &spec.serializer,
        )
        .map_err(|e| ServerError::coded(ErrorCode::BAD_POLICY_SPEC, e.to_string()))?;
        let mut inner = self.inner.lock();
        if inner.1.contains_key(&spec.name) {
            return Err(ServerError::coded(
                ErrorCode::TOPIC_EXISTS,
                format!("topic '{}' already exists", spec.name),
            ));
        }
        let id = inner.0;
        let topic = self.open_topic(PersistedTopic {
            id,
            spec: spec.clone(),
            producers: BTreeMap::new(),
            next_producer: 1,
            completed: false,
        })?;
        inner.0 += 1;
        inner.1.insert(spec.name.clone(), topic.clone());
        if let Err(e) = self.persist(&inner.1, inner.0) {
            inner.1.remove(&spec.name);
            return Err(e);
        }
        tracing::info!(topic = %spec.name, partitions = spec.partitions, "topic created");
        Ok(self.info(&topic))
    }

    pub fn get(&self, name: &str) -> Result<Arc<Topic>, ServerError> {
        self.inner.lock().1.get(name).cloned().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::TOPIC_NOT_FOUND,
                format!("no topic named '{name}'"),
            )
        })
    }

    pub fn partition(
        &self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<PartitionManager>, ServerError> {
        let t = self.get(topic)?;
        t.partitions
            .get(partition as usize)
            .cloned()
            .ok_or_else(|| {
                ServerError::coded(
                    ErrorCode::PARTITION_NOT_FOUND,
                    format!(
                        "topic '{topic}' has {} partitions; {partition} does not exist",
                        t.partitions.len()
                    ),
                )
            })
    }

    pub fn info(&self, t: &Topic) -> TopicInfo {
        let meta = t.meta.lock();
        TopicInfo {
            spec: meta.spec.clone(),
            partitions: t
                .partitions
                .iter()
                .map(|p| PartitionInfo {
                    id: p.id,
                    member: self.member,
                    addr: self.addr.clone(),
                    first_offset: p.log.first_offset(),
                    next_offset: p.log.next_offset(),
                })
                .collect(),
            state: Topic::state(&meta),
        }
    }

    pub fn list(&self) -> Vec<TopicInfo> {
        let topics: Vec<_> = self.inner.lock().1.values().cloned().collect();
        topics.iter().map(|t| self.info(t)).collect()
    }

    pub fn delete(&self, name: &str) -> Result<(), ServerError> {
        let mut inner = self.inner.lock();
        let topic = inner.1.remove(name).ok_or_else(|| {
            ServerError::coded(
                ErrorCode::TOPIC_NOT_FOUND,
                format!("no topic named '{name}'"),
            )
        })?;
        self.persist(&inner.1, inner.0)?;
        drop(inner);
        for p in &topic.partitions {
            p.mark_deleted();
        }
        let dir = self.topic_dir(topic.meta.lock().id, name);
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove a deleted topic's files");
            }
        }
        tracing::info!(topic = %name, "topic deleted");
        Ok(())
    }

    /// Applies a change to a topic's stream bookkeeping, persists it, and
    /// returns whether the stream has now ended.
    fn update<T>(
        &self,
        name: &str,
        f: impl FnOnce(&mut PersistedTopic) -> Result<T, ServerError>,
    ) -> Result<(T, bool, Arc<Topic>), ServerError> {
        let inner = self.inner.lock();
        let topic = inner.1.get(name).cloned().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::TOPIC_NOT_FOUND,
                format!("no topic named '{name}'"),
            )
        })?;
        let (out, ended) = {
            let mut meta = topic.meta.lock();
            let before = meta.clone();
            let out = f(&mut meta)?;
            let ended = Topic::state(&meta).ended;
            drop(meta);
            if let Err(e) = self.persist(&inner.1, inner.0) {
                *topic.meta.lock() = before;
                return Err(e);
            }
            (out, ended)
        };
        Ok((out, ended, topic))
    }

    fn check_open(meta: &PersistedTopic) -> Result<(), ServerError> {
        if Topic::state(meta).ended {
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

    pub fn register_producer(&self, topic: &str) -> Result<u64, ServerError> {
        Ok(self
            .update(topic, |m| {
                Self::check_open(m)?;
                let id = m.next_producer;
                m.next_producer += 1;
                m.producers.insert(id, false);
                Ok(id)
            })?
            .0)
    }

    /// Closes a producer's part of the stream; returns the topic if it ended.
    pub fn close_producer(
        &self,
        topic: &str,
        producer: u64,
    ) -> Result<Option<Arc<Topic>>, ServerError> {
        let (_, ended, t) = self.update(topic, |m| match m.producers.get_mut(&producer) {
            Some(closed) => {
                *closed = true;
                Ok(())
            }
            None => Err(ServerError::coded(
                ErrorCode::PRODUCER_NOT_FOUND,
                format!("topic '{topic}' has no producer {producer}"),
            )),
        })?;
        Ok(ended.then_some(t))
    }

    pub fn complete(&self, topic: &str) -> Result<Arc<Topic>, ServerError> {
        Ok(self
            .update(topic, |m| {
                m.completed = true;
                Ok(())
            })?
            .2)
    }

    pub fn shutdown(&self) {
        let topics: Vec<_> = self.inner.lock().1.values().cloned().collect();
        for t in topics {
            for p in &t.partitions {
                p.shutdown();
            }
        }
    }
}

impl Registry {
    /// Applies every partition's retention policy.
    pub fn enforce_retention(&self, now_us: u64) {
        let topics: Vec<_> = self.inner.lock().1.values().cloned().collect();
        for t in topics {
            for p in &t.partitions {
                match p.log.enforce_retention(now_us) {
                    Ok(0) => {}
                    Ok(n) => {
                        tracing::info!(topic = %p.topic, partition = p.id, segments = n, "retention dropped segments")
                    }
                    Err(e) => {
                        tracing::warn!(topic = %p.topic, partition = p.id, error = %e, "retention failed")
                    }
                }
            }
        }
    }
}
