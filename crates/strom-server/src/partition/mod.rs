//! One partition: the core every reader and writer of it goes through.
//!
//! The core owns the log and the consumer offset store (neither is
//! reachable from outside), the appender, what consumers may see
//! (`visible`, `sealed`), the waiters of caught-up readers and the stats.
//! Beside it, each in its own file:
//! - `append.rs`: appends under the partition's own append lock (no global
//!   lock; the lock order is the offset order), idempotent producers'
//!   sequence check ([`crate::producers`]; a resent batch is answered with
//!   its first offsets, never appended twice), `block` overflow (an append
//!   that would pass the bound is *held* with its reply until every known
//!   consumer name's *floor* moves past enough batches), and admission;
//! - `sync.rs`: `always` durability's group-commit syncer (one fdatasync
//!   for every waiting batch) and `interval:<ms>`'s timer thread;
//! - `read.rs`: offsets, reads of visible batches and data ranges, scrub,
//!   consumer offsets;
//! - `tail.rs`: the tail cursor every streaming reader uses (the native
//!   push stream, shared groups, Kafka's long-poll fetch): read up to
//!   `visible`, skip retention gaps, park in the waiters;
//! - `replication.rs`: the small trait through which replication plugs in
//!   ([`Replication`]: admit, durable end, leadership); a replicated
//!   partition shows consumers only what every in-sync copy holds and takes
//!   appends only on its leader. The partition never imports `replica/`;
//! - `tier.rs`: tiered storage of file partitions; `vfs.rs`: the file
//!   system file partitions use (the real one or a faulty one in tests).
//!
//! Consumer groups (`share/`, `fence.rs`) keep their state beside the
//! partition, in the `Host`, not on it.

mod append;
mod read;
mod replication;
mod sync;
mod tail;
mod tier;
mod vfs;

#[cfg(test)]
mod durable_acks;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strom_proto::{Durability, ErrorCode, Overflow, PartitionType, TopicSpec};
use strom_storage::{Appended, LogConfig, MemoryLog, OffsetStore, PartitionLog};
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::sink::Waiters;
use append::Appender;
use sync::{spawn, Unsynced};

pub use replication::{Admitted, Replication, EPOCHS_FILE};
pub use tail::{Read, Tail, TailCursor};

/// Called once with the append's outcome (on the appending or syncer thread).
pub type AppendReply = Box<dyn FnOnce(Result<Appended, ServerError>) + Send>;

/// Finds the partitions this server hosts (the `Host`), for the features
/// beside a partition that reach other partitions (a shared group's
/// dead-letter topic).
pub trait Lookup: Send + Sync {
    fn partition(&self, topic: &str, id: u32) -> Result<Arc<PartitionManager>, ServerError>;
    fn partitions_of(&self, topic: &str) -> Vec<Arc<PartitionManager>>;
}

pub struct PartitionManager {
    pub topic: String,
    pub id: u32,
    /// Read through `read.rs`, appended through `append.rs`: no one
    /// outside the partition touches its log or offset store.
    log: Arc<dyn PartitionLog>,
    offsets: OffsetStore,
    /// The partition's directory (file partitions).
    dir: Option<PathBuf>,
    /// The topic's durability (also how shared groups persist acks).
    pub durability: Durability,
    /// The same log when it is a memory log (overflow and its counter).
    mem: Option<Arc<MemoryLog>>,
    /// `block` overflow: the size bound enforced by holding appends.
    block_bound: Option<u64>,
    /// Lowest offset each known consumer name may still read (`block`).
    floors: Mutex<HashMap<String, u64>>,
    /// Serializes appends (and seal) of this partition; `None` once closed.
    appender: Mutex<Option<Appender>>,
    visible: watch::Sender<u64>,
    sealed: watch::Sender<bool>,
    /// Caught-up readers, fed each visible batch (`tail.rs`).
    waiters: Waiters,
    /// What this partition counts for the metrics tap.
    pub stats: Arc<crate::stats::PartitionStats>,
    deleted: AtomicBool,
    /// Closed because it moved to other members (`mark_released`), not
    /// because its topic was deleted: readers and writers are sent on.
    released: AtomicBool,
    /// Apply retention after every append (memory partitions).
    retain_on_append: bool,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The topic keeps more than one copy of each partition, or the
    /// registry gave this one a replica role (a partition of a topic
    /// without replication that moves: docs/elasticity.md).
    replicated: AtomicBool,
    /// Its role among the copies, once the registry gave one: what the
    /// partition asks of replication ([`Replication`]).
    replication: OnceLock<Arc<dyn Replication>>,
    /// Idempotent producers' sequences (under the append lock's order),
    /// read from the log when the first stamped batch comes (`None` until
    /// then: a partition no idempotent producer writes never scans).
    producers: Mutex<Option<crate::producers::Producers>>,
}

/// An opened log and what goes with it, for [`PartitionManager::start`].
pub(crate) struct Parts {
    pub log: Arc<dyn PartitionLog>,
    pub offsets: OffsetStore,
    /// The same log when it is a memory log.
    pub mem: Option<Arc<MemoryLog>>,
    /// `block` overflow: the size bound enforced by holding appends.
    pub block_bound: Option<u64>,
    /// The partition's directory (file partitions).
    pub dir: Option<PathBuf>,
}

/// Whether a file partition's directory must already exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Reopen a hosted partition: a missing directory is an error, never a
    /// silently empty log.
    Existing,
    /// Host a partition for the first time: create its directory durably.
    New,
}

impl PartitionManager {
    /// Opens (recovering) or creates the partition and starts its threads.
    pub fn open(
        spec: &TopicSpec,
        id: u32,
        dir: &Path,
        config: &ServerConfig,
        sealed: bool,
        mode: OpenMode,
    ) -> Result<Arc<Self>, ServerError> {
        if spec.partition_type == PartitionType::File && spec.overflow.is_some() {
            return Err(ServerError::coded(
                ErrorCode::INVALID_TOPIC_SPEC,
                format!(
                    "topic '{}': overflow applies only to memory partitions; file partitions keep their retention (retention_bytes, retention_ms)",
                    spec.name
                ),
            ));
        }
        // Memory partitions are bounded by default.
        let memory_bound = spec
            .retention_bytes
            .unwrap_or(config.memory_retention_bytes);
        let block_bound = match spec.effective_overflow() {
            Some(Overflow::Block) => Some(memory_bound),
            _ => None,
        };
        let log_config = LogConfig {
            segment_bytes: spec.segment_bytes.unwrap_or(config.segment_bytes),
            index_interval_bytes: config.index_interval_bytes,
            retention_bytes: match spec.effective_overflow() {
                // The oldest batches go first.
                Some(Overflow::DropOldest) => Some(memory_bound),
                // Enforced by holding appends instead.
                Some(Overflow::Block) => None,
                None => spec.retention_bytes,
            },
            retention_ms: spec.retention_ms,
            max_batch_bytes: config.max_batch_bytes,
        };
        let mut tiered = false;
        let (log, offsets, mem): (Arc<dyn PartitionLog>, OffsetStore, _) = match spec.partition_type
        {
            PartitionType::Memory => {
                let mem = Arc::new(MemoryLog::new(log_config));
                (mem.clone(), OffsetStore::in_memory(), Some(mem))
            }
            PartitionType::File => {
                let (log, is_tiered) = tier::open_file_log(spec, dir, config, log_config, mode)?;
                tiered = is_tiered;
                (log, OffsetStore::open(&dir.join("consumer-offsets"))?, None)
            }
        };
        let dir = (spec.partition_type == PartitionType::File).then(|| dir.to_path_buf());
        let parts = Parts {
            log,
            offsets,
            mem,
            block_bound,
            dir,
        };
        let pm = Self::start(spec, id, parts, sealed)?;
        if tiered {
            tier::spawn_tier_thread(&pm, Duration::from_millis(config.tier_check_ms))?;
        }
        Ok(pm)
    }

    /// Starts managing an opened log: the syncer (`always`) or interval
    /// thread, and the appender.
    pub(crate) fn start(
        spec: &TopicSpec,
        id: u32,
        parts: Parts,
        sealed: bool,
    ) -> Result<Arc<Self>, ServerError> {
        let Parts {
            log,
            offsets,
            mem,
            block_bound,
            dir,
        } = parts;
        // A partition of a topic without replication that got a replica
        // role once (it moved, docs/elasticity.md) has a leader-epoch
        // history: after a restart it waits for its role as a replica, and
        // takes no append before (it may not lead any more).
        let replicated =
            spec.replicas() > 1 || dir.as_ref().is_some_and(|d| d.join(EPOCHS_FILE).exists());
        // A replica's consumers see only what every in-sync copy holds:
        // nothing until its role and high watermark are known.
        let visible = if replicated {
            log.first_offset()
        } else {
            log.next_offset()
        };
        let pm = Arc::new(PartitionManager {
            topic: spec.name.clone(),
            id,
            dir,
            durability: spec.durability,
            mem,
            block_bound,
            floors: Mutex::new(HashMap::new()),
            visible: watch::Sender::new(visible),
            sealed: watch::Sender::new(sealed),
            waiters: Waiters::default(),
            stats: Default::default(),
            log,
            offsets,
            appender: Mutex::new(None),
            deleted: AtomicBool::new(false),
            released: AtomicBool::new(false),
            retain_on_append: spec.partition_type == PartitionType::Memory,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            replicated: AtomicBool::new(replicated),
            replication: OnceLock::new(),
            producers: Mutex::new(None),
        });
        let mut threads = Vec::new();
        // Memory partitions have nothing to sync: no syncer hop on their acks.
        let durability = match spec.partition_type {
            PartitionType::Memory => Durability::Never,
            PartitionType::File => spec.durability,
        };
        let syncer = match durability {
            Durability::Always => {
                let (stx, srx) = mpsc::channel::<Unsynced>();
                let p = pm.clone();
                threads.push(spawn(&pm, "sync", move || p.run_syncer(srx))?);
                Some(stx)
            }
            Durability::Interval(ms) => {
                let p = pm.clone();
                threads.push(spawn(&pm, "interval-sync", move || {
                    p.run_interval(Duration::from_millis(ms as u64))
                })?);
                None
            }
            Durability::Never => None,
        };
        *pm.appender.lock() = Some(Appender {
            syncer,
            held: VecDeque::new(),
        });
        *pm.threads.lock() = threads;
        Ok(pm)
    }

    /// `block` partition lets held appends in.
    pub fn enforce_retention(&self, now_us: u64) -> Result<u32, ServerError> {
        self.log.seal_rolled()?;
        let dropped = self.log.enforce_retention(now_us)?;
        if dropped > 0 {
            self.release_held();
        }
        Ok(dropped)
    }

    /// Events dropped by the overflow policy (`drop-oldest`) or by time
    /// retention since the partition was opened (memory partitions; 0 for
    /// file partitions, whose retention drops whole segments by design).
    pub fn dropped_events(&self) -> u64 {
        self.mem.as_ref().map_or(0, |m| m.dropped_events())
    }

    /// refused, and consumers get end-of-stream once they caught up.
    pub fn seal_blocking(&self) {
        let mut appender = self.appender.lock();
        if let Err(e) = self.log.sync_all() {
            tracing::error!(topic = %self.topic, partition = self.id, error = %e, "sync at seal failed");
        }
        self.publish_durable(self.log.next_offset());
        self.sealed.send_replace(true);
        let held = appender
            .as_mut()
            .map(|a| std::mem::take(&mut a.held))
            .unwrap_or_default();
        drop(appender);
        self.waiters.wake_all();
        self.refuse_held(held, || {
            ServerError::coded(
                ErrorCode::TOPIC_CLOSED,
                format!(
                    "topic '{}' ended while this batch waited for its consumers to free room in partition {}; it was not stored",
                    self.topic, self.id
                ),
            )
        });
    }

    pub async fn seal(self: &Arc<Self>) {
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.seal_blocking()).await;
    }

    pub fn watch_visible(&self) -> watch::Receiver<u64> {
        self.visible.subscribe()
    }

    pub fn watch_sealed(&self) -> watch::Receiver<bool> {
        self.sealed.subscribe()
    }

    pub fn is_sealed(&self) -> bool {
        *self.sealed.borrow()
    }

    /// The partition's directory (file partitions only).
    /// `memory` or `file`.
    pub fn partition_type(&self) -> &'static str {
        if self.mem.is_some() {
            "memory"
        } else {
            "file"
        }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Whether it was closed because it moved away (see `mark_released`).
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Notes, before it is closed as deleted here, that its copies moved
    /// to other members: readers and writers are then told
    /// `NOT_PARTITION_LEADER` (follow it), not that the topic is gone.
    pub fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    /// What a reader or writer of a closed partition is told: it moved
    /// away, or its topic was deleted.
    pub fn gone_error(&self) -> (ErrorCode, String) {
        if self.is_released() {
            (
                ErrorCode::NOT_PARTITION_LEADER,
                format!(
                    "partition {}/{} moved away from this member",
                    self.topic, self.id
                ),
            )
        } else {
            (
                ErrorCode::TOPIC_NOT_FOUND,
                format!("topic '{}' was deleted", self.topic),
            )
        }
    }

    fn publish(&self, next: u64) {
        self.visible.send_if_modified(|v| {
            let grew = next > *v;
            *v = (*v).max(next);
            grew
        });
    }

    /// Lets consumers see a batch: parked subscriptions get it pushed
    /// directly, the others are woken through `visible`. A replica's
    /// batch waits for the high watermark instead. `visible` moves first:
    /// a reader that parks after the offer went by finds it moved
    /// ([`TailCursor::park`](tail::TailCursor::park)).
    fn make_visible(&self, a: &Appended, meta: &Bytes) {
        if self.replicated() {
            return self.publish_durable(a.base_offset + a.count as u64);
        }
        self.publish(a.base_offset + a.count as u64);
        self.waiters.feed(self.id, a, meta);
    }

    /// Everything below `end` is durable here.
    fn publish_durable(&self, end: u64) {
        match (self.replicated(), self.replication.get()) {
            (false, _) => {
                // Nothing is offered: parked readers read it themselves.
                self.publish(end);
                self.waiters.wake_all();
            }
            (true, Some(r)) => r.durable(self, end),
            (true, None) => {}
        }
    }

    /// A replica's high watermark moved: consumers may read below `hwm`.
    pub(crate) fn publish_hwm(&self, hwm: u64) {
        if hwm > *self.visible.borrow() {
            self.publish(hwm);
            self.waiters.wake_all();
        }
    }

    /// Whether appends go through its replica (leader only, visible below
    /// the high watermark).
    pub fn replicated(&self) -> bool {
        self.replicated.load(Ordering::Acquire)
    }

    /// A partition of a topic without replication got a replica role: from
    /// now on it behaves as a replica (its role is set already).
    pub(crate) fn set_replicated(&self) {
        self.replicated.store(true, Ordering::Release);
    }

    /// Where consumers may read up to now.
    pub fn visible(&self) -> u64 {
        *self.visible.borrow()
    }

    /// Runs `f` with appends excluded (a replica's copy from its leader).
    pub(crate) fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        let _appends = self.appender.lock();
        f()
    }

    /// Refuses further appends, lets the syncer finish, and syncs.
    pub fn shutdown(&self) {
        let held = self
            .appender
            .lock()
            .take()
            .map(|a| a.held)
            .unwrap_or_default();
        self.refuse_held(held, || self.closed_error());
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in &threads {
            t.thread().unpark();
        }
        for t in threads {
            let _ = t.join();
        }
        if let Err(e) = self.log.close() {
            tracing::error!(topic = %self.topic, partition = self.id, error = %e, "final sync failed");
        }
    }

    pub fn mark_deleted(&self) {
        self.deleted.store(true, Ordering::Release);
        self.shutdown();
        // Wake subscriptions so they notice the deletion.
        self.waiters.wake_all();
        self.visible.send_modify(|_| {});
    }
}
