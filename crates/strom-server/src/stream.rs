//! Subscription streams: push a partition's metadata batches to a consumer
//! ahead of demand, within the credit the consumer granted (bounded
//! prefetch), then end-of-stream once the partition is sealed and drained.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use strom_net::{OutFrame, WriterHandle};
use strom_proto::{ErrorCode, Push};
use tokio::sync::Notify;

use crate::partition::PartitionManager;

/// Most metadata bytes read from the log per step.
const READ_BYTES: usize = 1 << 20;

/// Events the consumer is still willing to receive.
pub struct Credit {
    avail: AtomicI64,
    notify: Notify,
}

impl Credit {
    pub fn new(initial: u32) -> Arc<Self> {
        Arc::new(Credit {
            avail: AtomicI64::new(initial as i64),
            notify: Notify::new(),
        })
    }

    pub fn grant(&self, events: u32) {
        self.avail.fetch_add(events as i64, Ordering::AcqRel);
        self.notify.notify_one();
    }

    async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            if self.avail.load(Ordering::Acquire) > 0 {
                return;
            }
            notified.await;
        }
    }
}

pub async fn run(
    pm: Arc<PartitionManager>,
    stream: u64,
    mut pos: u64,
    credit: Arc<Credit>,
    writer: WriterHandle,
) {
    let mut visible = pm.watch_visible();
    let mut sealed = pm.watch_sealed();
    loop {
        if pm.is_deleted() {
            let _ = writer
                .send(OutFrame::push(
                    stream,
                    &Push::StreamError {
                        code: ErrorCode::TOPIC_NOT_FOUND,
                        message: format!("topic '{}' was deleted", pm.topic),
                    },
                ))
                .await;
            return;
        }
        let vis = *visible.borrow_and_update();
        if pos < vis {
            credit.wait().await;
            pos = pos.max(pm.log.first_offset());
            let batches = match pm.log.read(pos, READ_BYTES) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(topic = %pm.topic, partition = pm.id, offset = pos, error = %e, "read for a subscription failed");
                    let _ = writer
                        .send(OutFrame::push(
                            stream,
                            &Push::StreamError {
                                code: ErrorCode(e.code()),
                                message: e.to_string(),
                            },
                        ))
                        .await;
                    return;
                }
            };
            for b in batches {
                let end = b.base_offset + b.count as u64;
                if b.base_offset >= vis {
                    break;
                }
                let sent = end - pos.max(b.base_offset);
                let frame = OutFrame::push(
                    stream,
                    &Push::Events {
                        partition: pm.id,
                        base_offset: b.base_offset,
                        count: b.count,
                        timestamp_us: b.timestamp_us,
                        meta: b.meta,
                    },
                );
                if writer.send(frame).await.is_err() {
                    return;
                }
                credit.avail.fetch_sub(sent as i64, Ordering::AcqRel);
                pos = end;
            }
            continue;
        }
        if *sealed.borrow_and_update() && pos >= pm.log.next_offset() {
            let _ = writer
                .send(OutFrame::push(
                    stream,
                    &Push::EndOfStream {
                        partition: pm.id,
                        end_offset: pos,
                    },
                ))
                .await;
            return;
        }
        tokio::select! {
            r = visible.changed() => if r.is_err() { return },
            r = sealed.changed() => if r.is_err() { return },
        }
    }
}
