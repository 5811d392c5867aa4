//! Subscription streams: push a partition's metadata batches to a consumer
//! ahead of demand, within the credit the consumer granted (bounded
//! prefetch), then end-of-stream once the partition is sealed and drained.
//!
//! A stream that has caught up *parks* in the partition's `Waiters` as a
//! [`BatchSink`] (see `sink.rs`); the appender then offers it the next
//! batch, which it queues as a `Push` (no task wake-up on the latency path),
//! advancing its position. Otherwise the stream task reads the log itself.
//!
//! A range that storage quarantined as damaged is reported with a `Gap`
//! push (`DATA_CORRUPT`, naming the offsets), and the stream goes on after
//! it.
//!
//! A stream never waits for events that retention or `drop-oldest` dropped:
//! it moves on to the oldest kept batch, and the client, seeing a batch (or
//! the end of stream) start past its position, reports the gap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use strom_net::{OutFrame, WriterHandle};
use strom_proto::{ErrorCode, Push};
use strom_storage::{Appended, StorageError};
use tokio::sync::Notify;

use crate::partition::PartitionManager;
use crate::sink::{BatchSink, Credit};
use crate::stats::PartitionStats;

/// Most metadata bytes read from the log per step.
const READ_BYTES: usize = 1 << 20;

/// The native push sink: a caught-up stream parked in the partition's
/// [`Waiters`], to which the appender hands the next batch as a `Push`.
struct Parked {
    version: u8,
    stream: u64,
    pos: AtomicU64,
    credit: Arc<Credit>,
    writer: WriterHandle,
    wake: Notify,
    stats: Arc<PartitionStats>,
}

impl BatchSink for Parked {
    fn offer(&self, partition: u32, a: &Appended, meta: &Bytes) -> bool {
        if self.pos.load(Ordering::Acquire) != a.base_offset || !self.credit.has() {
            return false;
        }
        let frame = OutFrame::push(
            self.version,
            self.stream,
            &Push::Events {
                partition,
                base_offset: a.base_offset,
                count: a.count,
                timestamp_us: a.timestamp_us,
                meta: meta.clone(),
            },
        );
        if self.writer.try_send_frame(frame).is_ok() {
            self.pos
                .store(a.base_offset + a.count as u64, Ordering::Release);
            self.credit.take(a.count);
            self.stats.delivered(u64::from(a.count), meta.len() as u64);
        }
        true
    }

    fn wake(&self) {
        self.wake.notify_one();
    }
}

/// Where a stream's pushes go: the connection's writer, at its version.
struct Out<'a> {
    writer: &'a WriterHandle,
    version: u8,
    stream: u64,
}

async fn send(out: &Out<'_>, push: &Push) -> bool {
    let frame = OutFrame::push(out.version, out.stream, push);
    out.writer.send(frame).await.is_ok()
}

pub async fn run(
    pm: Arc<PartitionManager>,
    version: u8,
    stream: u64,
    mut pos: u64,
    credit: Arc<Credit>,
    writer: WriterHandle,
) {
    let out = Out {
        writer: &writer,
        version,
        stream,
    };
    let mut visible = pm.watch_visible();
    let mut sealed = pm.watch_sealed();
    loop {
        if pm.is_deleted() {
            let push = Push::StreamError {
                code: ErrorCode::TOPIC_NOT_FOUND,
                message: format!("topic '{}' was deleted", pm.topic),
            };
            send(&out, &push).await;
            return;
        }
        let vis = *visible.borrow_and_update();
        if pos < vis {
            credit.wait().await;
            // Events below the log's start were dropped (drop-oldest or
            // retention): skip them; the client sees the next batch start
            // past its position and reports the gap (DATA_EXPIRED).
            pos = pos.max(pm.log.first_offset());
            let batches = match pm.log.read(pos, READ_BYTES) {
                Ok(b) => b,
                // Dropped between the two calls: skip again.
                Err(StorageError::OffsetOutOfRange { .. }) => continue,
                // Damaged on disk and quarantined: say so, then go on after it.
                Err(StorageError::DataCorrupt { first, last }) => {
                    tracing::warn!(topic = %pm.topic, partition = pm.id, first, last, "reader reached a quarantined range");
                    let push = Push::Gap {
                        partition: pm.id,
                        first,
                        last,
                        code: ErrorCode::DATA_CORRUPT,
                    };
                    if !send(&out, &push).await {
                        return;
                    }
                    pos = pos.max(last.saturating_add(1));
                    continue;
                }
                Err(e) => {
                    tracing::error!(topic = %pm.topic, partition = pm.id, offset = pos, error = %e, "read for a subscription failed");
                    let push = Push::StreamError {
                        code: ErrorCode(e.code()),
                        message: e.to_string(),
                    };
                    send(&out, &push).await;
                    return;
                }
            };
            for b in batches {
                let end = b.base_offset + b.count as u64;
                if b.base_offset >= vis {
                    break;
                }
                let sent = end - pos.max(b.base_offset);
                let meta_bytes = b.meta.len() as u64;
                let push = Push::Events {
                    partition: pm.id,
                    base_offset: b.base_offset,
                    count: b.count,
                    timestamp_us: b.timestamp_us,
                    meta: b.meta,
                };
                if !send(&out, &push).await {
                    return;
                }
                credit.take(sent as u32);
                pm.stats.delivered(sent, meta_bytes);
                pos = end;
            }
            continue;
        }
        if *sealed.borrow_and_update() && pos >= pm.log.next_offset() {
            let push = Push::EndOfStream {
                partition: pm.id,
                end_offset: pos,
            };
            send(&out, &push).await;
            return;
        }
        // Caught up: park so the appender can push the next batch directly.
        let parked = Arc::new(Parked {
            version,
            stream,
            pos: AtomicU64::new(pos),
            credit: credit.clone(),
            writer: writer.clone(),
            wake: Notify::new(),
            stats: pm.stats.clone(),
        });
        let sink: Arc<dyn BatchSink> = parked.clone();
        pm.waiters.park(&sink);
        tokio::select! {
            _ = parked.wake.notified() => {}
            r = visible.changed() => if r.is_err() { pm.waiters.unpark(&sink); return },
            r = sealed.changed() => if r.is_err() { pm.waiters.unpark(&sink); return },
        }
        pm.waiters.unpark(&sink);
        pos = parked.pos.load(Ordering::Acquire);
    }
}
