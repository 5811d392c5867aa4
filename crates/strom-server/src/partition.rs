//! Partition manager: the single owner of one partition.
//!
//! Appends run on the connection task that received the batch, under the
//! partition's own append lock (no global lock; large batches move off the
//! async workers with `block_in_place`), so the lock order is the offset
//! order. With `always` durability a syncer thread makes appended batches
//! durable with group commit: it drains every waiting batch, issues one
//! fdatasync for all of them, then acknowledges them together, while
//! appends continue. With `interval:<ms>` a timer thread syncs in the
//! background. Consumers watch `visible` (the next offset they may read,
//! which with `always` only covers durable batches) and `sealed` (the
//! stream has ended); a subscription that is caught up parks in `waiters`,
//! and the next visible batch is pushed to it straight from here.
//!
//! Overflow of `memory` partitions (docs/configuration.md): with
//! `drop-oldest` the log's retention drops the oldest batches past the
//! bound (counted in [`PartitionManager::dropped_events`]). With `block`
//! (the default) nothing unread is dropped: an append that would pass the
//! bound is *held*, with its reply, in `held` (never blocking a thread),
//! and later appends queue behind it. Each consumer name that subscribed
//! or committed has a *floor* (the lowest offset it may still read); when a
//! floor moves, batches below the lowest floor are freed as far as needed
//! and held appends go in, in order. Seal, shutdown and deletion answer
//! every held append with an error.
//!
//! A replicated partition (`replication_factor` above 1) has a
//! [`Replica`](crate::replica::Replica) once the registry gave it a role:
//! consumers then see only up to the high watermark (what every in-sync
//! replica holds), and only its leader accepts appends ([`admit`]).
//!
//! A batch stamped by an idempotent producer is checked against the
//! partition's sequence table ([`crate::producers`]) as it goes in, under
//! the append lock: a resent batch is answered with its first offsets
//! (once those are durable, or replicated), never appended twice.
//!
//! [`admit`]: PartitionManager::admit

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strom_proto::{Durability, ErrorCode, Overflow, PartitionType, TopicSpec};
use strom_storage::{AppendBatch, Appended, LogConfig, MemoryLog, OffsetStore, PartitionLog};
use tokio::sync::watch;

use crate::batch::ValidBatch;
use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::producers::Check;
use crate::sink::Waiters;

/// Called once with the append's outcome (on the appending or syncer thread).
pub type AppendReply = Box<dyn FnOnce(Result<Appended, ServerError>) + Send>;

/// An appended batch waiting for its fdatasync.
struct Unsynced {
    appended: Appended,
    meta: Bytes,
    reply: AppendReply,
    /// A resent batch answered with its first append: nothing to publish.
    resent: bool,
}

/// An append waiting for room in a full `block` partition.
struct Held {
    batch: ValidBatch,
    reply: AppendReply,
}

impl Held {
    fn size(&self) -> u64 {
        self.batch.size()
    }
}

/// The append side of a partition, behind its append lock.
struct Appender {
    /// The group-commit syncer (`always` durability).
    syncer: Option<mpsc::Sender<Unsynced>>,
    /// Appends held until consumers free room (`block` overflow), in order.
    held: VecDeque<Held>,
}

/// A reply to run once the append lock is released.
type Answer = (AppendReply, Result<Appended, ServerError>);

pub struct PartitionManager {
    pub topic: String,
    pub id: u32,
    pub log: Arc<dyn PartitionLog>,
    pub offsets: OffsetStore,
    /// Shared consumer groups reading this partition.
    pub shares: crate::share::Cursors,
    /// Partitioned consumer groups' fences on this partition.
    pub fences: crate::fence::Fences,
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
    pub waiters: Waiters,
    /// What this partition counts for the metrics tap.
    pub stats: Arc<crate::stats::PartitionStats>,
    deleted: AtomicBool,
    /// Apply retention after every append (memory partitions).
    retain_on_append: bool,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The topic keeps more than one copy of each partition, or the
    /// registry gave this one a replica role (a partition of a topic
    /// without replication that moves: docs/elasticity.md).
    replicated: AtomicBool,
    /// Its role among the copies, once the registry gave one.
    pub replica: std::sync::OnceLock<Arc<crate::replica::Replica>>,
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
        let replicated = spec.replicas() > 1
            || dir
                .as_ref()
                .is_some_and(|d| d.join(crate::replica::EPOCHS_FILE).exists());
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
            shares: Default::default(),
            fences: Default::default(),
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
            retain_on_append: spec.partition_type == PartitionType::Memory,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            replicated: AtomicBool::new(replicated),
            replica: std::sync::OnceLock::new(),
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

    /// Appends a batch; calls order the offsets. `reply` runs once the
    /// batch is appended (and durable, with `always`). A full `block`
    /// partition holds the batch (and `reply`) until consumers free room.
    /// Blocking file I/O: call it off the async workers for large batches.
    pub fn append(&self, batch: ValidBatch, reply: AppendReply) {
        // Whatever path it came by, an append to a replica that does not
        // lead goes nowhere: its log is the leader's copy.
        if self.replicated() && !self.replica.get().is_some_and(|r| r.is_leader()) {
            return reply(Err(ServerError::coded(
                ErrorCode::NOT_PARTITION_LEADER,
                format!(
                    "partition {}/{} takes appends only on its leader",
                    self.topic, self.id
                ),
            )));
        }
        let mut guard = self.appender.lock();
        let Some(ap) = guard.as_mut() else {
            drop(guard);
            return reply(Err(self.closed_error()));
        };
        let held = Held { batch, reply };
        if let Some(bound) = self.block_bound {
            if !self.is_sealed() && (!ap.held.is_empty() || !self.has_room(held.size(), bound)) {
                ap.held.push_back(held);
                tracing::debug!(topic = %self.topic, partition = self.id, held = ap.held.len(), bound, "partition full; append held until its consumers ack");
                return;
            }
        }
        let answer = self.append_locked(ap, held);
        drop(guard);
        if let Some((reply, r)) = answer {
            reply(r);
        }
    }

    /// Appends under the append lock; returns the reply to run after it is
    /// released, unless the syncer took it.
    fn append_locked(&self, ap: &Appender, h: Held) -> Option<Answer> {
        let stamp = h.batch.stamp();
        if let Some(s) = stamp {
            match self.producers().check(s) {
                Check::Fresh => {}
                Check::Duplicate(first) => return self.answer_resent(ap, first, h),
                Check::OutOfOrder(why) => {
                    let e = ServerError::coded(ErrorCode::OUT_OF_ORDER_SEQUENCE, why);
                    return Some((h.reply, Err(e)));
                }
                Check::StaleEpoch(why) => {
                    let e = ServerError::coded(ErrorCode::STALE_PRODUCER_EPOCH, why);
                    return Some((h.reply, Err(e)));
                }
            }
        }
        let appended = match self.append_now(&h.batch) {
            Ok(a) => a,
            Err(e) => return Some((h.reply, Err(e))),
        };
        if let Some(s) = stamp {
            self.producers().appended(s, &appended);
        }
        self.answer_appended(ap, appended, h, false)
    }

    /// A resent batch: answered with its first append's outcome, once that
    /// is durable (after the first answer, through the same syncer).
    fn answer_resent(&self, ap: &Appender, first: Appended, h: Held) -> Option<Answer> {
        tracing::debug!(topic = %self.topic, partition = self.id, base_offset = first.base_offset, "a resent batch answered with its first append");
        self.answer_appended(ap, first, h, true)
    }

    fn answer_appended(
        &self,
        ap: &Appender,
        appended: Appended,
        h: Held,
        resent: bool,
    ) -> Option<Answer> {
        match &ap.syncer {
            Some(s) => {
                let job = Unsynced {
                    appended,
                    meta: h.batch.meta().clone(),
                    reply: h.reply,
                    resent,
                };
                match s.send(job) {
                    Ok(()) => None,
                    Err(mpsc::SendError(job)) => Some((
                        job.reply,
                        Err(ServerError::coded(
                            ErrorCode::SHUTTING_DOWN,
                            "partition syncer stopped",
                        )),
                    )),
                }
            }
            None => {
                if !resent {
                    self.make_visible(&appended, h.batch.meta());
                }
                Some((h.reply, Ok(appended)))
            }
        }
    }

    /// Whether a batch of `size` bytes fits in a `block` partition now,
    /// freeing batches every known consumer acked as far as needed.
    fn has_room(&self, size: u64, bound: u64) -> bool {
        let Some(mem) = &self.mem else { return true };
        let floor = self.floors.lock().values().copied().min();
        mem.make_room(size, bound, floor)
    }

    /// A consumer name subscribed at, or committed, `offset`: it may still
    /// read from there. Frees room in a `block` partition and lets held
    /// appends in. Cheap for memory partitions; call it off the async
    /// workers otherwise (held appends may write).
    pub fn consumer_at(&self, consumer: &str, offset: u64) {
        if self.block_bound.is_none() {
            return;
        }
        self.floors.lock().insert(consumer.to_string(), offset);
        self.release_held();
    }

    /// Appends the held batches that fit now, in order.
    fn release_held(&self) {
        let Some(bound) = self.block_bound else {
            return;
        };
        let mut answers = Vec::new();
        {
            let mut guard = self.appender.lock();
            let Some(ap) = guard.as_mut() else { return };
            while ap
                .held
                .front()
                .is_some_and(|h| self.has_room(h.size(), bound))
            {
                let Some(h) = ap.held.pop_front() else { break };
                answers.extend(self.append_locked(ap, h));
            }
            if !answers.is_empty() {
                tracing::debug!(topic = %self.topic, partition = self.id, released = answers.len(), still_held = ap.held.len(), "consumers freed room; held appends stored");
            }
        }
        for (reply, r) in answers {
            reply(r);
        }
    }

    /// The periodic pass: seals the segments the log rolled away from (off
    /// the append path), then applies retention; room it frees in a
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

    fn closed_error(&self) -> ServerError {
        if self.is_deleted() {
            ServerError::coded(
                ErrorCode::TOPIC_NOT_FOUND,
                format!("topic '{}' was deleted", self.topic),
            )
        } else {
            ServerError::coded(
                ErrorCode::SHUTTING_DOWN,
                format!("partition {}/{} is closed", self.topic, self.id),
            )
        }
    }

    /// Answers held appends with `error` (they were never stored).
    fn refuse_held(&self, held: VecDeque<Held>, error: impl Fn() -> ServerError) {
        if held.is_empty() {
            return;
        }
        tracing::info!(topic = %self.topic, partition = self.id, refused = held.len(), "held appends refused");
        for h in held {
            (h.reply)(Err(error()));
        }
    }

    /// Ends the stream: every append before this is kept, later ones are
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

    fn publish(&self, next: u64) {
        self.visible.send_if_modified(|v| {
            let grew = next > *v;
            *v = (*v).max(next);
            grew
        });
    }

    /// Lets consumers see a batch: parked subscriptions get it pushed
    /// directly, the others are woken through `visible`. A replica's
    /// batch waits for the high watermark instead.
    fn make_visible(&self, a: &Appended, meta: &Bytes) {
        if self.replicated() {
            return self.publish_durable(a.base_offset + a.count as u64);
        }
        self.waiters.feed(self.id, a, meta);
        self.publish(a.base_offset + a.count as u64);
    }

    /// Everything below `end` is durable here.
    fn publish_durable(&self, end: u64) {
        match (self.replicated(), self.replica.get()) {
            (false, _) => self.publish(end),
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
    pub(crate) fn visible(&self) -> u64 {
        *self.visible.borrow()
    }

    /// Runs `f` with appends excluded (a replica's copy from its leader).
    pub(crate) fn exclusive<R>(&self, f: impl FnOnce() -> R) -> R {
        let _appends = self.appender.lock();
        f()
    }

    /// The sequence table, read from the log's tail the first time.
    fn producers(&self) -> parking_lot::MappedMutexGuard<'_, crate::producers::Producers> {
        parking_lot::MutexGuard::map(self.producers.lock(), |t| {
            t.get_or_insert_with(|| crate::producers::Producers::rebuild(&*self.log))
        })
    }

    /// A follower copied the batch `meta` as `a`: its stamp, if any, is
    /// known here now (so this replica answers its resend as a leader).
    /// (A table not read yet will find it in the log.)
    pub(crate) fn copied(&self, meta: &[u8], a: &Appended) {
        if let (Some(s), Some(t)) = (strom_proto::stamp_of(meta), self.producers.lock().as_mut()) {
            t.appended(s, a);
        }
    }

    /// The log was cut: the sequence table is read again when next needed.
    pub(crate) fn forget_producers(&self) {
        *self.producers.lock() = None;
    }

    /// Whether an append may go in here now, and the reply to give it: a
    /// replicated partition takes appends only on its leader, `acks_all`
    /// ones only with `min_in_sync` replicas in sync, and their reply waits
    /// until every in-sync replica has the batch. Hands `reply` back with
    /// the refusal.
    pub fn admit(
        &self,
        acks_all: bool,
        reply: AppendReply,
    ) -> Result<AppendReply, (AppendReply, ServerError)> {
        if !self.replicated() {
            return Ok(reply);
        }
        match self.replica.get() {
            Some(r) => r.admit(acks_all, reply),
            None => Err((
                reply,
                ServerError::coded(
                    ErrorCode::NOT_PARTITION_LEADER,
                    format!(
                        "partition {}/{} has no role from the registry yet",
                        self.topic, self.id
                    ),
                ),
            )),
        }
    }

    fn append_now(&self, batch: &ValidBatch) -> Result<Appended, ServerError> {
        if self.is_sealed() {
            return Err(ServerError::coded(
                ErrorCode::TOPIC_CLOSED,
                format!(
                    "topic '{}' has ended; it accepts no more events",
                    self.topic
                ),
            ));
        }
        let started = std::time::Instant::now();
        let appended = self
            .log
            .append(AppendBatch {
                count: batch.count(),
                meta: batch.meta(),
                data: batch.data(),
            })
            .inspect_err(|_| self.stats.append_failed())?;
        self.stats
            .appended(batch.count(), batch.size(), started.elapsed());
        if self.retain_on_append {
            self.log.enforce_retention(appended.timestamp_us)?;
        }
        Ok(appended)
    }

    /// Group commit: one fdatasync covers every batch waiting at that moment.
    fn run_syncer(self: Arc<Self>, rx: mpsc::Receiver<Unsynced>) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while let Ok(more) = rx.try_recv() {
                group.push(more);
            }
            let token = group
                .iter()
                .map(|u| u.appended.token)
                .max()
                .expect("non-empty group");
            let started = std::time::Instant::now();
            let synced = self.log.sync(token);
            self.stats.synced(started.elapsed());
            match synced {
                Ok(()) => {
                    for u in group {
                        if !u.resent {
                            self.make_visible(&u.appended, &u.meta);
                        }
                        (u.reply)(Ok(u.appended));
                    }
                }
                Err(e) => {
                    tracing::error!(topic = %self.topic, partition = self.id, error = %e, "fdatasync failed");
                    let code = ErrorCode(e.code());
                    for u in group {
                        (u.reply)(Err(ServerError::coded(code, e.to_string())));
                    }
                }
            }
        }
    }

    fn run_interval(self: Arc<Self>, every: Duration) {
        while !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(every);
            let started = std::time::Instant::now();
            let synced = self.log.sync_all();
            self.stats.synced(started.elapsed());
            if let Err(e) = synced {
                tracing::warn!(topic = %self.topic, partition = self.id, error = %e, "interval sync failed");
            }
        }
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
        self.shares.close_all();
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

fn spawn(
    pm: &PartitionManager,
    role: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<JoinHandle<()>, ServerError> {
    std::thread::Builder::new()
        .name(format!("strom-{role}-{}", pm.id))
        .spawn(f)
        .map_err(|e| ServerError::io("starting a partition thread", e))
}

#[path = "partition_tier.rs"]
mod tier;

#[path = "partition_vfs.rs"]
mod vfs;

#[cfg(test)]
#[path = "partition_durable_acks.rs"]
mod durable_acks;
