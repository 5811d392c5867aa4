//! Partition manager: the single owner of one partition.
//!
//! A dedicated writer thread appends batches in arrival order and assigns
//! offsets; nothing else writes, so there is no lock on the hot path beyond
//! the channel. With `always` durability a syncer thread makes appended
//! batches durable with group commit: it drains every waiting batch, issues
//! one fdatasync for all of them, then acknowledges them together, while the
//! writer keeps appending. With `interval:<ms>` a timer thread syncs in the
//! background. Consumers watch `visible` (the next offset they may read,
//! which with `always` only covers durable batches) and `sealed` (the
//! stream has ended).

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
use tokio::sync::{oneshot, watch};

use crate::config::ServerConfig;
use crate::error::ServerError;

/// Called once with the append's outcome, on the writer or syncer thread.
pub type AppendReply = Box<dyn FnOnce(Result<Appended, ServerError>) + Send>;

enum WriterMsg {
    Append {
        meta: Bytes,
        count: u32,
        data: Vec<Bytes>,
        reply: AppendReply,
    },
    Seal(oneshot::Sender<()>),
}

pub struct PartitionManager {
    pub topic: String,
    pub id: u32,
    pub log: Arc<dyn PartitionLog>,
    pub offsets: OffsetStore,
    tx: Mutex<Option<mpsc::Sender<WriterMsg>>>,
    visible: watch::Sender<u64>,
    sealed: watch::Sender<bool>,
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
        let (tx, rx) = mpsc::channel();
        let pm = Arc::new(PartitionManager {
            topic: spec.name.clone(),
            id,
            visible: watch::Sender::new(log.next_offset()),
            sealed: watch::Sender::new(sealed),
            log,
            offsets,
            tx: Mutex::new(Some(tx)),
            deleted: AtomicBool::new(false),
            retain_on_append: spec.partition_type == PartitionType::Memory,
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        let syncer = match spec.durability {
            Durability::Always => {
                let (stx, srx) = mpsc::channel::<(Appended, AppendReply)>();
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
        let p = pm.clone();
        threads.insert(0, spawn(&pm, "writer", move || p.run_writer(rx, syncer))?);
        *pm.threads.lock() = threads;
        Ok(pm)
    }

    /// Queues a batch for append; order of calls is the order of offsets.
    /// `reply` runs once the batch is appended (and durable, with `always`).
    pub fn append(&self, meta: Bytes, count: u32, data: Vec<Bytes>, reply: AppendReply) {
        let msg = WriterMsg::Append {
            meta,
            count,
            data,
            reply,
        };
        if let Err(mpsc::SendError(WriterMsg::Append { reply, .. })) = self.send(msg) {
            reply(Err(ServerError::coded(
                ErrorCode::SHUTTING_DOWN,
                format!("partition {}/{} is closed", self.topic, self.id),
            )));
        }
    }

    fn send(&self, msg: WriterMsg) -> Result<(), mpsc::SendError<WriterMsg>> {
        match &*self.tx.lock() {
            Some(tx) => tx.send(msg),
            None => Err(mpsc::SendError(msg)),
        }
    }

    /// Ends the stream: every append queued before this is kept, later ones
    /// are refused, and consumers get end-of-stream once they caught up.
    pub async fn seal(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(WriterMsg::Seal(tx)).is_ok() {
            let _ = rx.await;
        } else {
            self.sealed.send_replace(true);
        }
    }

    /// [`seal`](Self::seal) for callers outside the async runtime.
    pub fn seal_blocking(&self) {
        let (tx, rx) = oneshot::channel();
        if self.send(WriterMsg::Seal(tx)).is_ok() {
            let _ = rx.blocking_recv();
        } else {
            self.sealed.send_replace(true);
        }
    }

    pub fn watch_visible(&self) -> watch::Receiver<u64> {
        self.visible.subscribe()
    }

    pub fn watch_sealed(&self) -> watch::Receiver<bool> {
        self.sealed.subscribe()
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

    fn run_writer(
        self: Arc<Self>,
        rx: mpsc::Receiver<WriterMsg>,
        syncer: Option<mpsc::Sender<(Appended, AppendReply)>>,
    ) {
        for msg in rx {
            match msg {
                WriterMsg::Append {
                    meta,
                    count,
                    data,
                    reply,
                } => {
                    let result = self.append_now(&meta, count, &data);
                    match (result, &syncer) {
                        (Ok(a), Some(s)) => {
                            if let Err(mpsc::SendError((_, reply))) = s.send((a, reply)) {
                                reply(Err(ServerError::coded(
                                    ErrorCode::SHUTTING_DOWN,
                                    "partition syncer stopped",
                                )));
                            }
                        }
                        (Ok(a), None) => {
                            self.publish(a.base_offset + a.count as u64);
                            reply(Ok(a));
                        }
                        (Err(e), _) => {
                            reply(Err(e));
                        }
                    }
                }
                WriterMsg::Seal(done) => {
                    if let Err(e) = self.log.sync_all() {
                        tracing::error!(topic = %self.topic, partition = self.id, error = %e, "sync at seal failed");
                    }
                    self.publish(self.log.next_offset());
                    self.sealed.send_replace(true);
                    let _ = done.send(());
                }
            }
        }
    }

    fn append_now(
        &self,
        meta: &Bytes,
        count: u32,
        data: &[Bytes],
    ) -> Result<Appended, ServerError> {
        if *self.sealed.borrow() {
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
    fn run_syncer(self: Arc<Self>, rx: mpsc::Receiver<(Appended, AppendReply)>) {
        while let Ok(first) = rx.recv() {
            let mut group = vec![first];
            while let Ok(more) = rx.try_recv() {
                group.push(more);
            }
            let token = group
                .iter()
                .map(|(a, _)| a.token)
                .max()
                .expect("non-empty group");
            match self.log.sync(token) {
                Ok(()) => {
                    let next = group
                        .iter()
                        .map(|(a, _)| a.base_offset + a.count as u64)
                        .max()
                        .unwrap_or(0);
                    self.publish(next);
                    for (a, reply) in group {
                        reply(Ok(a));
                    }
                }
                Err(e) => {
                    tracing::error!(topic = %self.topic, partition = self.id, error = %e, "fdatasync failed");
                    let code = ErrorCode(e.code());
                    for (_, reply) in group {
                        reply(Err(ServerError::coded(code, e.to_string())));
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

    /// Stops the threads after the queued appends are done, and syncs.
    pub fn shutdown(&self) {
        self.tx.lock().take();
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
