//! Data requests of the native protocol: decode, call the
//! [`DataService`](crate::service::DataService), encode. Answers that wait
//! on file work are sent from their own task, so the connection keeps
//! reading requests meanwhile.

use std::sync::Arc;

use strom_net::OutFrame;
use strom_proto::message::DataItem;
use strom_proto::{ErrorCode, Response, StartPos};

use super::{stream, Session};
use crate::batch::ValidBatch;
use crate::error::ServerError;
use crate::partition::AppendReply;
use crate::quota::Limit;
use crate::sink::Credit;

impl Session {
    /// Who reads this connection's streams, for their consume quota.
    pub(super) fn stream_reader(&self) -> Arc<stream::Reader> {
        Arc::new(stream::Reader {
            quotas: self.svc.quotas.clone(),
            who: self.principal.clone(),
        })
    }

    /// Until when a quota holds the answer to a request of this
    /// connection moving `bytes` of `topic`; `None`: not held.
    fn held(&self, kind: Limit, topic: &str, bytes: u64) -> Option<tokio::time::Instant> {
        let wait = self.svc.quotas.delay(kind, &self.principal, topic, bytes);
        (!wait.is_zero()).then(|| tokio::time::Instant::now() + wait)
    }

    pub(super) async fn produce(
        &mut self,
        id: u64,
        topic: &str,
        partition: u32,
        acks_all: bool,
        batch: Option<ValidBatch>,
    ) {
        let p = match (self.partition(topic, partition), batch) {
            (Ok(p), Some(batch)) => (p, batch),
            (Err(e), _) => return self.respond(id, Err(e)),
            (Ok(_), None) => {
                let e = ServerError::coded(
                    ErrorCode::INTERNAL,
                    "a produce request reached dispatch without its checked batch",
                );
                return self.respond(id, Err(e));
            }
        };
        let (p, batch) = p;
        // A produce quota holds the answer (never the append) until the
        // principal's and the topic's traffic is back within its rate.
        let held = match self.held(Limit::Produce, topic, batch.size()) {
            Some(until) => {
                let cap = self.svc.config.max_connection_buffer_bytes;
                let n = batch.size().clamp(1, cap).min(u64::from(u32::MAX)) as u32;
                let Ok(permit) = self.throttled.clone().acquire_many_owned(n).await else {
                    return;
                };
                Some((until, permit))
            }
            None => None,
        };
        // With priorities in force, the append waits for its turn and
        // holds its slot while it writes (not while it waits for its acks:
        // a held `block` append or an acks=all one must not keep others
        // from the reads and appends that would free it).
        let slot = self
            .svc
            .quotas
            .scheduled(&self.principal, topic, batch.size())
            .await;
        let writer = self.writer.clone();
        let version = self.version;
        let svc = self.svc.clone();
        // The reply may run on the partition's syncer thread, outside the runtime.
        let handle = tokio::runtime::Handle::current();
        let reply: AppendReply = Box::new(move |r| {
            let resp = match r {
                Ok(a) => Response::Produced {
                    base_offset: a.base_offset,
                    count: a.count,
                    timestamp_us: a.timestamp_us,
                },
                Err(e) => super::failure(&svc, &e),
            };
            let frame = OutFrame::response(version, id, &resp);
            if let Some((until, permit)) = held {
                handle.spawn(async move {
                    tokio::time::sleep_until(until).await;
                    let _ = writer.send(frame).await;
                    drop(permit);
                });
                return;
            }
            if let Err(frame) = writer.try_send_frame(frame) {
                handle.spawn(async move {
                    let _ = writer.send(frame).await;
                });
            }
        });
        // A large batch is written while the loop reads the next request
        // (see `appending`).
        match self.svc.data.produce_pipelined(p, batch, acks_all, reply) {
            Ok(Some(write)) if slot.is_some() => {
                let peer = self.peer.clone();
                self.appending = Some(tokio::spawn(async move {
                    if let Err(e) = write.await {
                        tracing::error!(peer = %peer, error = %e, "a pipelined append task failed");
                    }
                    drop(slot);
                }));
            }
            Ok(appending) => self.appending = appending,
            Err(e) => self.respond(id, Err(e.into())),
        }
    }

    pub(super) fn subscribe(
        &mut self,
        stream: u64,
        topic: &str,
        partition: u32,
        consumer: &str,
        start: StartPos,
        prefetch: u32,
    ) -> Result<Response, ServerError> {
        let p = self.partition(topic, partition)?;
        let pos = self.svc.data.subscribe_at(&p, consumer, start);
        let credit = Credit::new(self.svc.data.prefetch(prefetch));
        self.unsubscribe(stream);
        let task = tokio::spawn(stream::run(
            p,
            self.version,
            stream,
            pos,
            credit.clone(),
            self.writer.clone(),
            self.stream_reader(),
        ));
        self.streams.insert(stream, (task, credit));
        Ok(Response::Subscribed { start_offset: pos })
    }

    pub(super) fn credit(&self, stream: u64, events: u32) {
        if let Some((_, c)) = self.streams.get(&stream) {
            c.grant(events);
        }
    }

    pub(super) fn unsubscribe(&mut self, stream: u64) {
        if let Some((task, _)) = self.streams.remove(&stream) {
            task.abort();
        }
    }

    pub(super) async fn fetch(
        &mut self,
        id: u64,
        topic: &str,
        partition: u32,
        items: Vec<DataItem>,
    ) {
        let p = match self.partition(topic, partition) {
            Ok(p) => p,
            Err(e) => return self.respond(id, Err(e)),
        };
        let wanted = match self.svc.data.fetch_size(&items) {
            Ok(w) => w,
            Err(e) => return self.respond(id, Err(e)),
        };
        // Stop reading this connection's requests while too much fetched
        // data waits to be sent: a client that never reads its answers
        // cannot grow the server.
        let cap = self.svc.config.max_connection_buffer_bytes;
        let permits = wanted.clamp(1, cap).min(u32::MAX as u64) as u32;
        let Ok(permit) = self.budget.clone().acquire_many_owned(permits).await else {
            return;
        };
        let writer = self.writer.clone();
        let svc = self.svc.clone();
        let version = self.version;
        let who = self.principal.clone();
        let topic = topic.to_string();
        tokio::spawn(async move {
            // With priorities in force, the read waits for its turn.
            let slot = svc.quotas.scheduled(&who, &topic, wanted).await;
            let read = svc.data.fetch(p, items).await;
            drop(slot);
            let frame = match read {
                Ok(bulk) => {
                    let total = bulk.iter().map(|b| b.len() as u64).sum();
                    // A consume quota holds the answer, and with it this
                    // connection's fetch budget.
                    let wait = svc.quotas.delay(Limit::Consume, &who, &topic, total);
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    OutFrame::response(version, id, &Response::Data { total })
                        .with_bulk(bulk)
                        .with_hold(permit)
                }
                Err(e) => OutFrame::response(version, id, &super::failure(&svc, &e)),
            };
            let _ = writer.send(frame).await;
        });
    }

    pub(super) fn commit(
        &mut self,
        id: u64,
        topic: &str,
        partition: u32,
        consumer: String,
        offset: u64,
    ) {
        match self.partition(topic, partition) {
            Ok(p) => {
                let svc = self.svc.clone();
                self.respond_later(id, async move {
                    svc.data.commit(p, consumer, offset).await?;
                    Ok(Response::Done)
                });
            }
            Err(e) => self.respond(id, Err(e)),
        }
    }

    pub(super) fn scrub(&mut self, id: u64, topic: &str, partition: u32) {
        match self.partition(topic, partition) {
            Ok(p) => {
                let svc = self.svc.clone();
                self.respond_later(id, async move {
                    let v = svc.data.scrub(p).await?;
                    Ok(Response::Scrubbed {
                        segments: v.segments,
                        batches: v.batches,
                        bytes: v.bytes,
                        damaged: v.damaged,
                        quarantined: v.quarantined,
                    })
                });
            }
            Err(e) => self.respond(id, Err(e)),
        }
    }
}
