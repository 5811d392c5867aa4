//! Subscription streams: push a partition's metadata batches to a consumer
//! ahead of demand, within the credit the consumer granted (bounded
//! prefetch), then end-of-stream once the partition is sealed and drained.
//!
//! The stream follows the partition with its tail cursor
//! (`partition/tail.rs`). Once caught up it *parks* as a [`BatchSink`]
//! (see `sink.rs`); the appender then offers it each next batch, which it
//! writes as a `Push` (no task wake-up on the latency path), advancing its
//! position, and it stays parked while its credit lasts. Otherwise the
//! stream task reads the tail itself.
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
use std::time::Duration;

use bytes::Bytes;
use strom_net::{OutFrame, WriterHandle};
use strom_proto::{ErrorCode, Push};
use strom_storage::Appended;
use tokio::sync::Notify;

use crate::partition::{PartitionManager, Read, Tail, TailCursor};
use crate::quota::{Limit, Quotas};
use crate::sink::{BatchSink, Credit};
use crate::stats::PartitionStats;

/// Most metadata bytes read from the log per step.
const READ_BYTES: usize = 1 << 20;

/// Who reads a stream, for its consume quota: the metadata pushed counts
/// as consumed bytes, and the stream waits as long as the quota says
/// before it pushes more.
pub struct Reader {
    pub quotas: Arc<Quotas>,
    pub who: strom_auth::Principal,
}

impl Reader {
    fn delay(&self, topic: &str, bytes: u64) -> Duration {
        self.quotas.delay(Limit::Consume, &self.who, topic, bytes)
    }
}

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
    reader: Arc<Reader>,
    topic: String,
    /// What the consume quota held the pushed batch for, in microseconds.
    owed: AtomicU64,
}

impl BatchSink for Parked {
    fn offer(&self, partition: u32, a: &Appended, meta: &Bytes) -> bool {
        let pos = self.pos.load(Ordering::Acquire);
        if a.base_offset != pos || !self.credit.has() {
            // A batch past its position (it missed one), or no credit:
            // the task reads the log, or waits for credit.
            return a.base_offset >= pos;
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
            let wait = self.reader.delay(&self.topic, meta.len() as u64);
            self.owed
                .fetch_max(wait.as_micros() as u64, Ordering::AcqRel);
            // Stays parked for the next batch (no task wake-up per batch)
            // unless the credit ran out or the consume quota holds it.
            return !self.credit.has() || !wait.is_zero();
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
    pos: u64,
    credit: Arc<Credit>,
    writer: WriterHandle,
    reader: Arc<Reader>,
) {
    let out = Out {
        writer: &writer,
        version,
        stream,
    };
    let mut tail = TailCursor::new(pm.clone(), pos);
    loop {
        match tail.poll() {
            Tail::Deleted => {
                let (code, message) = pm.gone_error();
                let push = Push::StreamError { code, message };
                send(&out, &push).await;
                return;
            }
            Tail::Ended(end_offset) => {
                let push = Push::EndOfStream {
                    partition: pm.id,
                    end_offset,
                };
                send(&out, &push).await;
                return;
            }
            Tail::Ready => {
                credit.wait().await;
                match push_read(&out, &mut tail, &credit, &reader).await {
                    Some(wait) if !wait.is_zero() => tokio::time::sleep(wait).await,
                    Some(_) => {}
                    None => return,
                }
            }
            Tail::CaughtUp => {
                // Park so the appender can push the next batch directly.
                let parked = Arc::new(Parked {
                    version,
                    stream,
                    pos: AtomicU64::new(tail.pos()),
                    credit: credit.clone(),
                    writer: writer.clone(),
                    wake: Notify::new(),
                    stats: pm.stats.clone(),
                    reader: reader.clone(),
                    topic: pm.topic.clone(),
                    owed: AtomicU64::new(0),
                });
                let sink: Arc<dyn BatchSink> = parked.clone();
                if !tail.park(&sink, parked.wake.notified()).await {
                    return;
                }
                tail.advance_to(parked.pos.load(Ordering::Acquire));
                let owed = parked.owed.load(Ordering::Acquire);
                if owed > 0 {
                    tokio::time::sleep(Duration::from_micros(owed)).await;
                }
            }
        }
    }
}

/// Reads the next visible batches and pushes them: how long the consume
/// quota holds the stream now, or `None` once the stream must end (its
/// connection closed, or the read failed).
async fn push_read(
    out: &Out<'_>,
    tail: &mut TailCursor,
    credit: &Credit,
    reader: &Reader,
) -> Option<Duration> {
    let pm = tail.partition().clone();
    let from = tail.pos();
    match tail.read(READ_BYTES) {
        Ok(Read::Batches(batches)) => {
            let mut pos = from;
            let mut pushed = 0u64;
            for b in batches {
                let end = b.base_offset + u64::from(b.count);
                let sent = end - pos.max(b.base_offset);
                let meta_bytes = b.meta.len() as u64;
                let push = Push::Events {
                    partition: pm.id,
                    base_offset: b.base_offset,
                    count: b.count,
                    timestamp_us: b.timestamp_us,
                    meta: b.meta,
                };
                if !send(out, &push).await {
                    return None;
                }
                credit.take(sent as u32);
                pm.stats.delivered(sent, meta_bytes);
                pushed += meta_bytes;
                pos = end;
            }
            Some(reader.delay(&pm.topic, pushed))
        }
        // Damaged on disk and quarantined: say so, then go on after it.
        Ok(Read::Gap { first, last }) => {
            let push = Push::Gap {
                partition: pm.id,
                first,
                last,
                code: ErrorCode::DATA_CORRUPT,
            };
            send(out, &push).await.then_some(Duration::ZERO)
        }
        Err(e) => {
            tracing::error!(topic = %pm.topic, partition = pm.id, offset = from, error = %e, "read for a subscription failed");
            let push = Push::StreamError {
                code: ErrorCode(e.code()),
                message: e.to_string(),
            };
            send(out, &push).await;
            None
        }
    }
}
