//! The partitions this server hosts, whichever member holds the registry.
//!
//! The master tells a member to host partitions of a topic (`host`), to seal
//! them at end of stream (`seal`) and to drop them when the topic is deleted.
//! The set persists in `hosted.json` so a restarted member reopens its
//! partitions, through the same code path as a fresh start, before it serves.
//! Partitions reopen in parallel. One that cannot be opened (damaged or
//! missing files) does not stop the server: it is listed as unavailable,
//! with the reason, and every request for it gets `PARTITION_UNAVAILABLE`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strom_proto::{ErrorCode, PartitionInfo, PartitionStatus, ReplicaRole, TopicSpec};

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::fence::Fences;
use crate::group::{read_json_or_default, write_json};
use crate::names::check_topic_name;
use crate::partition::{Lookup, OpenMode, PartitionManager};
use crate::replica::{Replica, ReplicaCtx};
use crate::share::Cursors;

#[derive(Serialize, Deserialize, Clone)]
struct HostedRecord {
    id: u64,
    spec: TopicSpec,
    partitions: Vec<u32>,
    sealed: bool,
}

/// One hosted partition and what lives beside it: its consumer groups'
/// state (shared cursors, partitioned groups' fences) and its role among
/// the copies. All of it goes when the partition goes.
pub struct Slot {
    pub partition: Arc<PartitionManager>,
    pub shares: Cursors,
    pub fences: Fences,
    replica: OnceLock<Arc<Replica>>,
}

impl Slot {
    fn new(partition: Arc<PartitionManager>) -> Arc<Slot> {
        Arc::new(Slot {
            partition,
            shares: Cursors::default(),
            fences: Fences::default(),
            replica: OnceLock::new(),
        })
    }

    /// Its replica, once the registry gave it a role.
    pub fn replica(&self) -> Option<&Arc<Replica>> {
        self.replica.get()
    }

    /// Closes the partition and what lives beside it: deleted (`delete`:
    /// the deletion is visible before the shared cursors close, so their
    /// members are told) or shut down.
    fn close(&self, delete: bool) {
        if let Some(r) = self.replica.get() {
            r.stop();
        }
        if delete {
            self.partition.mark_deleted();
            self.shares.close_all();
        } else {
            self.shares.close_all();
            self.partition.shutdown();
        }
    }
}

struct Hosted {
    record: HostedRecord,
    partitions: BTreeMap<u32, Arc<Slot>>,
    /// Partitions that could not be opened, with the reason.
    broken: BTreeMap<u32, String>,
}

pub struct Host {
    file: PathBuf,
    topics_dir: PathBuf,
    config: ServerConfig,
    topics: Mutex<HashMap<String, Hosted>>,
}

/// Opened partitions and the ones that failed, of one hosted topic.
type Opened = (BTreeMap<u32, Arc<Slot>>, BTreeMap<u32, String>);

impl Host {
    pub fn open(config: &ServerConfig) -> Result<Self, ServerError> {
        let file = config.data_dir.join("hosted.json");
        let topics_dir = config.data_dir.join("topics");
        std::fs::create_dir_all(&topics_dir)
            .map_err(|e| ServerError::io(format!("creating {}", topics_dir.display()), e))?;
        let records: Vec<HostedRecord> = read_json_or_default(&file)?;
        let host = Host {
            file,
            topics_dir,
            config: config.clone(),
            topics: Mutex::new(HashMap::new()),
        };
        let opened = host.open_all(&records);
        for (r, (partitions, broken)) in records.into_iter().zip(opened) {
            host.topics.lock().insert(
                r.spec.name.clone(),
                Hosted {
                    record: r,
                    partitions,
                    broken,
                },
            );
        }
        Ok(host)
    }

    /// Reopens every hosted partition, several at a time.
    fn open_all(&self, records: &[HostedRecord]) -> Vec<Opened> {
        let jobs: Vec<(usize, u32)> = records
            .iter()
            .enumerate()
            .flat_map(|(i, r)| r.partitions.iter().map(move |&p| (i, p)))
            .collect();
        let threads = std::thread::available_parallelism()
            .map_or(2, |n| n.get())
            .clamp(1, 16);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = Mutex::new(Vec::with_capacity(jobs.len()));
        std::thread::scope(|scope| {
            for _ in 0..threads.min(jobs.len()) {
                scope.spawn(|| loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(i, p)) = jobs.get(k) else { break };
                    let r = self.open_partition(&records[i], p, OpenMode::Existing);
                    results.lock().push((i, p, r));
                });
            }
        });
        let mut out: Vec<Opened> = records.iter().map(|_| Opened::default()).collect();
        for (i, p, r) in results.into_inner() {
            match r {
                Ok(pm) => {
                    out[i].0.insert(p, Slot::new(pm));
                }
                Err(e) => {
                    let topic = &records[i].spec.name;
                    tracing::error!(topic = %topic, partition = p, error = %e, "partition could not be opened; serving the others");
                    out[i].1.insert(p, e.to_string());
                }
            }
        }
        out
    }

    fn open_partition(
        &self,
        r: &HostedRecord,
        p: u32,
        mode: OpenMode,
    ) -> Result<Arc<PartitionManager>, ServerError> {
        let dir = self.topics_dir.join(format!("{}.{}", r.spec.name, r.id));
        let dir = dir.join(p.to_string());
        PartitionManager::open(&r.spec, p, &dir, &self.config, r.sealed, mode)
    }

    /// Creates partitions this server hosts for the first time.
    fn create_partitions(
        &self,
        r: &HostedRecord,
        ids: &[u32],
    ) -> Result<BTreeMap<u32, Arc<Slot>>, ServerError> {
        ids.iter()
            .map(|&p| Ok((p, Slot::new(self.open_partition(r, p, OpenMode::New)?))))
            .collect()
    }

    fn persist(&self, topics: &HashMap<String, Hosted>) -> Result<(), ServerError> {
        let records: Vec<&HostedRecord> = topics.values().map(|h| &h.record).collect();
        write_json(&self.file, &records)
    }

    /// Hosts (creating or reopening) these partitions; idempotent.
    pub fn host(
        &self,
        topic_id: u64,
        spec: &TopicSpec,
        partitions: &[u32],
        sealed: bool,
    ) -> Result<(), ServerError> {
        check_topic_name(&spec.name)?;
        let mut topics = self.topics.lock();
        if let Some(h) = topics.get(&spec.name) {
            if h.record.id != topic_id {
                // A topic of that name was deleted and created again.
                let old = topics.remove(&spec.name).expect("present");
                self.remove_files(old);
            }
        }
        let entry = topics.entry(spec.name.clone()).or_insert_with(|| Hosted {
            record: HostedRecord {
                id: topic_id,
                spec: spec.clone(),
                partitions: Vec::new(),
                sealed,
            },
            partitions: BTreeMap::new(),
            broken: BTreeMap::new(),
        });
        entry.record.spec = spec.clone();
        let new: Vec<u32> = partitions
            .iter()
            .copied()
            .filter(|p| !entry.partitions.contains_key(p) && !entry.broken.contains_key(p))
            .collect();
        let opened = self.create_partitions(&entry.record, &new)?;
        entry.partitions.extend(opened);
        entry.record.partitions = entry
            .partitions
            .keys()
            .chain(entry.broken.keys())
            .copied()
            .collect();
        entry.record.partitions.sort_unstable();
        let seal_now = sealed && !entry.record.sealed;
        entry.record.sealed |= sealed;
        let to_seal: Vec<_> = if seal_now {
            entry
                .partitions
                .values()
                .map(|s| s.partition.clone())
                .collect()
        } else {
            Vec::new()
        };
        self.persist(&topics)?;
        drop(topics);
        for p in to_seal {
            p.seal_blocking();
        }
        Ok(())
    }

    pub fn get(&self, topic: &str, partition: u32) -> Result<Arc<PartitionManager>, ServerError> {
        Ok(self.slot(topic, partition)?.partition.clone())
    }

    /// A hosted partition with what lives beside it, or why it cannot be
    /// served.
    pub fn slot(&self, topic: &str, partition: u32) -> Result<Arc<Slot>, ServerError> {
        let topics = self.topics.lock();
        let h = topics.get(topic).ok_or_else(|| {
            ServerError::coded(
                ErrorCode::TOPIC_NOT_FOUND,
                format!("this server hosts no partition of topic '{topic}'"),
            )
        })?;
        if let Some(why) = h.broken.get(&partition) {
            return Err(ServerError::coded(
                ErrorCode::PARTITION_UNAVAILABLE,
                format!(
                    "partition {partition} of topic '{topic}' is unavailable on this server: {why}"
                ),
            ));
        }
        h.partitions.get(&partition).cloned().ok_or_else(|| {
            ServerError::coded(
                ErrorCode::PARTITION_NOT_FOUND,
                format!("this server does not host partition {partition} of topic '{topic}'"),
            )
        })
    }

    /// The spec of a hosted topic.
    pub fn spec(&self, topic: &str) -> Option<TopicSpec> {
        self.topics.lock().get(topic).map(|h| h.record.spec.clone())
    }

    /// The in-sync replicas an `acks=all` append to `topic` needs.
    pub fn min_in_sync(&self, topic: &str) -> u32 {
        self.topics
            .lock()
            .get(topic)
            .map_or(1, |h| h.record.spec.min_in_sync_replicas())
    }

    /// Ends the stream on every local partition of the topic.
    pub async fn seal(&self, topic: &str) -> Result<(), ServerError> {
        let parts: Vec<_> = {
            let mut topics = self.topics.lock();
            let Some(h) = topics.get_mut(topic) else {
                return Ok(());
            };
            h.record.sealed = true;
            let parts = h.partitions.values().map(|s| s.partition.clone()).collect();
            self.persist(&topics)?;
            parts
        };
        for p in parts {
            p.seal().await;
        }
        Ok(())
    }

    pub fn drop_topic(&self, topic: &str) -> Result<(), ServerError> {
        let mut topics = self.topics.lock();
        if let Some(h) = topics.remove(topic) {
            self.persist(&topics)?;
            drop(topics);
            self.remove_files(h);
        }
        Ok(())
    }

    /// Drops the local copies of `partitions` of the topic (they moved
    /// away): their replicas stop, readers are woken and told, and their
    /// files are removed. Idempotent; a topic id that is not the hosted
    /// one (the topic was deleted and created again) drops nothing.
    pub fn release(
        &self,
        topic: &str,
        topic_id: u64,
        partitions: &[u32],
    ) -> Result<(), ServerError> {
        let mut topics = self.topics.lock();
        let Some(h) = topics.get_mut(topic).filter(|h| h.record.id == topic_id) else {
            return Ok(());
        };
        let mut gone = Vec::new();
        for p in partitions {
            let pm = h.partitions.remove(p);
            if pm.is_some() || h.broken.remove(p).is_some() {
                gone.push((*p, pm));
            }
        }
        if gone.is_empty() {
            return Ok(());
        }
        let released: std::collections::HashSet<u32> = gone.iter().map(|(p, _)| *p).collect();
        h.record.partitions.retain(|p| !released.contains(p));
        let dir = self
            .topics_dir
            .join(format!("{}.{}", h.record.spec.name, h.record.id));
        let empty = h.record.partitions.is_empty();
        if empty {
            topics.remove(topic);
        }
        self.persist(&topics)?;
        drop(topics);
        for (p, slot) in gone {
            if let Some(slot) = slot {
                slot.partition.mark_released();
                slot.close(true);
            }
            remove_dir(&dir.join(p.to_string()));
            tracing::info!(topic, partition = p, "released a partition that moved away");
        }
        if empty {
            remove_dir(&dir);
        }
        Ok(())
    }

    fn remove_files(&self, h: Hosted) {
        for s in h.partitions.values() {
            s.close(true);
        }
        let dir = self
            .topics_dir
            .join(format!("{}.{}", h.record.spec.name, h.record.id));
        remove_dir(&dir);
    }

    /// Offsets of the listed local partitions (unknown ones are skipped).
    pub fn stats(
        &self,
        topic: &str,
        partitions: &[u32],
        member: u32,
        addr: &str,
    ) -> Vec<PartitionInfo> {
        let topics = self.topics.lock();
        let Some(h) = topics.get(topic) else {
            return Vec::new();
        };
        partitions
            .iter()
            .filter_map(|p| {
                let (first_offset, next_offset, status, dropped_events) =
                    match (h.partitions.get(p), h.broken.get(p)) {
                        (Some(s), _) => (
                            s.partition.first_offset(),
                            s.partition.next_offset(),
                            s.partition
                                .failure()
                                .map_or(PartitionStatus::Ok, PartitionStatus::Failed),
                            s.partition.dropped_events(),
                        ),
                        (None, Some(why)) => (0, 0, PartitionStatus::Unavailable(why.clone()), 0),
                        (None, None) => return None,
                    };
                Some(PartitionInfo {
                    id: *p,
                    member,
                    addr: addr.to_string(),
                    first_offset,
                    next_offset,
                    status,
                    dropped_events,
                    replicas: Vec::new(),
                    isr: Vec::new(),
                    epoch: 0,
                    moving_to: Vec::new(),
                })
            })
            .collect()
    }

    /// The open local partitions of one topic.
    pub fn partitions_of(&self, topic: &str) -> Vec<Arc<PartitionManager>> {
        self.topics
            .lock()
            .get(topic)
            .map(|h| h.partitions.values().map(|s| s.partition.clone()).collect())
            .unwrap_or_default()
    }

    /// The open local partitions of one topic, with what lives beside them.
    pub fn slots_of(&self, topic: &str) -> Vec<Arc<Slot>> {
        self.topics
            .lock()
            .get(topic)
            .map(|h| h.partitions.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Every open local partition.
    pub(crate) fn all(&self) -> Vec<Arc<PartitionManager>> {
        self.all_slots()
            .into_iter()
            .map(|s| s.partition.clone())
            .collect()
    }

    pub(crate) fn all_slots(&self) -> Vec<Arc<Slot>> {
        self.topics
            .lock()
            .values()
            .flat_map(|h| h.partitions.values().cloned())
            .collect()
    }

    pub fn enforce_retention(&self, now_us: u64) {
        for p in self.all() {
            match p.enforce_retention(now_us) {
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

    pub fn shutdown(&self) {
        for s in self.all_slots() {
            s.close(false);
        }
    }
}

impl Host {
    /// Gives each listed partition of `topic` here its role among the
    /// copies (opening its replica the first time).
    pub fn set_replica_roles(
        &self,
        ctx: &ReplicaCtx,
        topic: &str,
        roles: &[ReplicaRole],
    ) -> Result<(), ServerError> {
        for role in roles {
            let slot = self.slot(topic, role.partition)?;
            let pm = &slot.partition;
            let r = match slot.replica.get() {
                Some(r) => r.clone(),
                None => {
                    let r = Replica::open(pm, ctx, self.min_in_sync(topic))?;
                    let r = slot.replica.get_or_init(|| r).clone();
                    pm.replicate_with(r.clone());
                    r
                }
            };
            r.set_role(role)?;
            if !pm.replicated() {
                // A partition of a topic without replication that moves: it
                // gets its role first, then takes appends as a replica.
                tracing::info!(
                    topic,
                    partition = role.partition,
                    "partition became a replica (it moves)"
                );
                pm.set_replicated();
            }
        }
        Ok(())
    }
}

impl Lookup for Host {
    fn partition(&self, topic: &str, id: u32) -> Result<Arc<PartitionManager>, ServerError> {
        self.get(topic, id)
    }

    fn partitions_of(&self, topic: &str) -> Vec<Arc<PartitionManager>> {
        Host::partitions_of(self, topic)
    }
}

/// Removes a directory tree that is no longer needed; a failure is logged.
fn remove_dir(dir: &std::path::Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(dir = %dir.display(), error = %e, "could not remove files no longer needed");
        }
    }
}
