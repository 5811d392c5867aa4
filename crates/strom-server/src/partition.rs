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

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use strom_proto::{BatchView, Durability, ErrorCode, PartitionType, TopicSpec};
use strom_storage::{
    AppendBatch, Appended, FileLog, LogConfig, MemoryLog, OffsetStore, PartitionLog,
};
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::error::ServerError;
use crate::stream::Waiters;

/// Called once with the append's outcome (on the appending or syncer thread).
pub type AppendReply = Box<dyn FnOnce(Result<Appended, ServerError>) + Send>;

/// An appended batch waiting for its fdatasync.
struct Unsynced {
    appended: Appended,
    meta: Bytes,
    reply: AppendReply,
}

pub struct PartitionManager {
    pub topic: String,
    pub id: u32,
    pub log: Arc<dyn PartitionLog>,
    pub offsets: OffsetStore,
    /// Serializes appends (and seal) of this partition; `None` once closed.
    appender: Mutex<Option<Option<mpsc::Sender<Unsynced>>>>,
    visible: watch::Sender<u64>,
    sealed: watch::Sender<bool>,
    pub waiters: Waiters,
    deleted: AtomicBool,
    /// Apply retention after every append (memory partitions).
    retain_on_append: bool,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl PartitionManager {
    /// Opens (recovering) or creates the partition and starts its threads.
    pub fn open(
        spec: &TopicSpec,
        id: u32,
        dir: &Path,
        config: &ServerConfig,
        sealed: bool,
    ) -> Result<Arc<Self>, ServerError> {
        let log_config = LogConfig {
            segment_bytes: spec.segment_bytes.unwrap_or(config.segment_bytes),
            index_interval_bytes: config.index_interval_bytes,
            // Memory partitions are bounded by default: oldest batches go first.
            retention_bytes: match spec.partition_type {
                PartitionType::Memory => {
                    spec.retention_bytes.or(Some(config.memory_retention_bytes))
                }
                PartitionType::File => spec.retention_bytes,
            },
            retention_ms: spec.retention_ms,
            max_batch_bytes: config.max_batch_bytes,
        };
        let (log, offsets): (Arc<dyn PartitionLog>, OffsetStore) = match spec.partition_type {
            PartitionType::Memory => (
                Arc::new(MemoryLog::new(log_config)),
                OffsetStore::in_memory(),
            ),
            PartitionType::File => (
                Arc::new(FileLog::open(dir, log_config)?),
                OffsetStore::open(&dir.join("consumer-offsets"))?,
            ),
        };
        let pm = Arc::new(PartitionManager {
            topic: spec.name.clone(),
            id,
            visible: watch::Sender::new(log.next_offset()),
            sealed: watch::Sender::new(sealed),
            waiters: Waiters::default(),
            log,
            offsets,
            appender: Mutex::new(None),
            deleted: AtomicBool::new(false),
            retain_on_append: spec.partition_type == PartitionType::Memory,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        let syncer = match spec.durability {
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
        *pm.appender.lock() = Some(syncer);
        *pm.threads.lock() = threads;
        Ok(pm)
    }

    /// Appends a batch now; calls order the offsets. `reply` runs once the
    /// batch is appended (and durable, with `always`). Blocking file I/O:
    /// call it off the async workers for large batches.
    pub fn append(&self, meta: Bytes, count: u32, data: Vec<Bytes>, reply: AppendReply) {
        let appender = self.appender.lock();
        let Some(syncer) = &*appender else {
            drop(appender);
            return reply(Err(ServerError::coded(
                ErrorCode::SHUTTING_DOWN,
                format!("partition {}/{} is closed", self.topic, self.id),
            )));
        };
        let appended = match self.append_now(&meta, count, &data) {
            Ok(a) => a,
            Err(e) => {
                drop(appender);
                return reply(Err(e));
            }
        };
        match syncer {
            Some(s) => {
                let job = Unsynced {
                    appended,
                    meta,
                    reply,
                };
                if let Err(mpsc::SendError(job)) = s.send(job) {
                    drop(appender);
                    (job.reply)(Err(ServerError::coded(
                        ErrorCode::SHUTTING_DOWN,
                        "partition syncer stopped",
                    )));
                }
            }
            None => {
                self.make_visible(&appended, &meta);
                drop(appender);
                reply(Ok(appended));
            }
        }
    }

    /// Ends the stream: every append before this is kept, later ones are
    /// refused, and consumers get end-of-stream once they caught up.
    pub fn seal_blocking(&self) {
        let appender = self.appender.lock();
        if let Err(e) = self.log.sync_all() {
            tracing::error!(topic = %self.topic, partition = self.id, error = %e, "sync at seal failed");
        }
        self.publish(self.log.next_offset());
        self.sealed.send_replace(true);
        drop(appender);
        self.waiters.wake_all();
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
    /// directly, the others are woken through `visible`.
    fn make_visible(&self, a: &Appended, meta: &Bytes) {
        self.waiters.feed(self.id, a, meta);
        self.publish(a.base_offset + a.count as u64);
    }

    fn append_now(
        &self,
        meta: &Bytes,
        count: u32,
        data: &[Bytes],
    ) -> Result<Appended, ServerError> {
        if self.is_sealed() {
            return Err(ServerError::coded(
                ErrorCode::TOPIC_CLOSED,
                format!(
                    "topic '{}' has ended; it accepts no more events",
                    self.topic
                ),
            ));
        }
        let view = BatchView::parse(meta.clone()).map_err(|e| {
            ServerError::coded(ErrorCode::MALFORMED_FRAME, format!("bad batch: {e}"))
        })?;
        let data_len: u64 = data.iter().map(|d| d.len() as u64).sum();
        if view.count() != count || count == 0 || view.data_len() != data_len {
            return Err(ServerError::coded(
                ErrorCode::MALFORMED_FRAME,
                format!(
                    "batch header says {count} events, its table {} events and {} data bytes, {data_len} data bytes were sent",
                    view.count(),
                    view.data_len()
                ),
            ));
        }
        let appended = self.log.append(AppendBatch { count, meta, data })?;
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
            match self.log.sync(token) {
                Ok(()) => {
                    for u in group {
                        self.make_visible(&u.appended, &u.meta);
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
            if let Err(e) = self.log.sync_all() {
                tracing::warn!(topic = %self.topic, partition = self.id, error = %e, "interval sync failed");
            }
        }
    }

    /// Refuses further appends, lets the syncer finish, and syncs.
    pub fn shutdown(&self) {
        self.appender.lock().take();
        self.stop.store(true, Ordering::Release);
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in &threads {
            t.thread().unpark();
        }
        for t in threads {
            let _ = t.join();
        }
        if let Err(e) = self.log.sync_all() {
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
