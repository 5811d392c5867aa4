//! One client connection: decode requests, dispatch them, answer.
//!
//! Produce requests are queued to their partition manager in the order they
//! arrive (which fixes their offsets) and answered when the append is done.
//! Data fetches run on the blocking pool and answer with the bytes as a bulk
//! payload. A malformed frame gets an error response, closes this connection
//! and is logged; other connections carry on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use strom_net::{spawn_writer, Conn, NetError, OutFrame, WriterHandle};
use strom_proto::{ErrorCode, FrameKind, Request, Response, StartPos};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::batch::ValidBatch;
use crate::control;
use crate::error::ServerError;
use crate::partition::{AppendReply, PartitionManager};
use crate::sink::Credit;
use crate::state::State;
use crate::stream;

/// Batches with more data than this are appended under `block_in_place`.
const BLOCKING_APPEND: u64 = 256 << 10;

struct Session {
    state: Arc<State>,
    writer: WriterHandle,
    peer: String,
    partitions: HashMap<(String, u32), Arc<PartitionManager>>,
    streams: HashMap<u64, (JoinHandle<()>, Arc<Credit>)>,
    /// Bytes of fetched data read for this connection and not yet written.
    budget: Arc<Semaphore>,
}

/// One decoded request, with its checked batch if it is a `Produce`.
type Incoming = (strom_proto::FrameHeader, Request, Option<ValidBatch>);

pub async fn serve(conn: Conn, state: Arc<State>, _slot: OwnedSemaphorePermit) {
    let peer = conn.peer.clone();
    let writer = spawn_writer(conn.writer, conn.direct, peer.clone(), |_| {});
    let mut reader = conn.reader;
    let cfg = &state.config;
    let handshake = Instant::now() + Duration::from_millis(cfg.handshake_timeout_ms);
    let frame_timeout = Duration::from_millis(cfg.frame_timeout_ms);
    let budget = Arc::new(Semaphore::new(cfg.max_connection_buffer_bytes as usize));
    let mut s = Session {
        state: state.clone(),
        writer,
        peer: peer.clone(),
        partitions: HashMap::new(),
        streams: HashMap::new(),
        budget,
    };
    tracing::debug!(peer = %peer, "connection opened");
    let mut first = true;
    loop {
        // Idle between frames is fine, except before the first one; once a
        // frame has begun, all of it must arrive in bounded time.
        let deadline = if first {
            handshake
        } else {
            match reader.ready().await {
                Ok(true) => Instant::now() + frame_timeout,
                Ok(false) => break,
                Err(e) => {
                    s.reject(0, &e).await;
                    break;
                }
            }
        };
        let (header, req, batch) = match tokio::time::timeout_at(
            deadline,
            read_request(&mut reader),
        )
        .await
        {
            Ok(Ok(Some(r))) => r,
            Ok(Ok(None)) => break,
            Ok(Err((id, e))) => {
                s.reject(id, &e).await;
                break;
            }
            Err(_) => {
                let phase = if first { "first frame" } else { "frame" };
                tracing::warn!(peer = %peer, phase, "closing a connection that stalled mid-frame or never spoke");
                break;
            }
        };
        first = false;
        s.dispatch(header.id, req, batch).await;
    }
    for (_, (task, _)) in s.streams.drain() {
        task.abort();
    }
    tracing::debug!(peer = %peer, "connection closed");
}

/// Reads and decodes one request frame with its bulk payload. An error
/// carries the request id to answer (0 before the header is known).
async fn read_request(
    reader: &mut strom_net::FrameReader<strom_net::BoxRead>,
) -> Result<Option<Incoming>, (u64, NetError)> {
    if !reader.ready().await.map_err(|e| (0, e))? {
        return Ok(None);
    }
    let (header, body) = match reader.next().await {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(e) => return Err((0, e)),
    };
    let id = header.id;
    if header.kind != FrameKind::Request {
        let e = NetError::Proto(strom_proto::ProtoError::Unknown {
            what: "frame kind from a client",
            value: header.kind as u64,
        });
        return Err((id, e));
    }
    let req = Request::decode(header.opcode, &body).map_err(|e| (id, NetError::Proto(e)))?;
    let batch = if let Request::Produce { count, meta, .. } = &req {
        let bulk = reader.read_bulk().await.map_err(|e| (id, e))?;
        // A batch whose table disagrees with what was sent is a malformed frame.
        let batch =
            ValidBatch::check(*count, meta.clone(), bulk).map_err(|e| (id, NetError::Proto(e)))?;
        Some(batch)
    } else {
        if reader.pending_bulk() > 0 {
            let e = NetError::BulkMismatch {
                announced: reader.pending_bulk(),
                expected: 0,
            };
            return Err((id, e));
        }
        None
    };
    Ok(Some((header, req, batch)))
}

/// Total bytes a FetchData asks for (saturating: lengths come from the wire).
fn requested_bytes(items: &[strom_proto::message::DataItem]) -> u64 {
    items
        .iter()
        .flat_map(|(_, ranges)| ranges.iter())
        .fold(0u64, |acc, (_, len)| acc.saturating_add(*len))
}

impl Session {
    /// Answers a malformed frame with an error, and logs it; the caller closes.
    async fn reject(&self, id: u64, e: &NetError) {
        if matches!(e, NetError::Closed) || matches!(e, NetError::Io { .. }) {
            tracing::debug!(peer = %self.peer, error = %e, "connection lost");
            return;
        }
        tracing::warn!(peer = %self.peer, error = %e, "closing connection after a malformed frame");
        let _ = self
            .writer
            .send(OutFrame::response(
                id,
                &Response::error(e.code(), e.to_string()),
            ))
            .await;
    }

    fn partition(
        &mut self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<PartitionManager>, ServerError> {
        let key = (topic.to_string(), partition);
        if let Some(p) = self.partitions.get(&key).filter(|p| !p.is_deleted()) {
            return Ok(p.clone());
        }
        let p = self.state.host.get(topic, partition)?;
        self.partitions.insert(key, p.clone());
        Ok(p)
    }

    fn respond(&self, id: u64, result: Result<Response, ServerError>) {
        let writer = self.writer.clone();
        let resp = result.unwrap_or_else(|e| Response::error(e.code(), e.to_string()));
        if id == 0 {
            if let Response::Error { message, .. } = &resp {
                tracing::debug!(peer = %self.peer, error = %message, "one-way request failed");
            }
            return;
        }
        if writer.try_send(OutFrame::response(id, &resp)).is_err() {
            tokio::spawn(async move {
                let _ = writer.send(OutFrame::response(id, &resp)).await;
            });
        }
    }

    async fn dispatch(&mut self, id: u64, req: Request, batch: Option<ValidBatch>) {
        let st = self.state.clone();
        let result = match req {
            Request::Produce {
                topic, partition, ..
            } => match (self.partition(&topic, partition), batch) {
                (Ok(p), Some(batch)) => {
                    let writer = self.writer.clone();
                    let handle = tokio::runtime::Handle::current();
                    let big = batch.size() > BLOCKING_APPEND;
                    let reply: AppendReply = Box::new(move |r| {
                        let resp = match r {
                            Ok(a) => Response::Produced {
                                base_offset: a.base_offset,
                                count: a.count,
                                timestamp_us: a.timestamp_us,
                            },
                            Err(e) => Response::error(e.code(), e.to_string()),
                        };
                        // Queue the answer right away; only a full queue needs a task.
                        if let Err(frame) = writer.try_send_frame(OutFrame::response(id, &resp)) {
                            handle.spawn(async move {
                                let _ = writer.send(frame).await;
                            });
                        }
                    });
                    // Large batches mean long file writes: let the runtime move
                    // other work off this worker meanwhile.
                    if big {
                        tokio::task::block_in_place(|| p.append(batch, reply));
                    } else {
                        p.append(batch, reply);
                    }
                    return;
                }
                (Err(e), _) => Err(e),
                (Ok(_), None) => Err(ServerError::coded(
                    ErrorCode::INTERNAL,
                    "a produce request reached dispatch without its checked batch",
                )),
            },
            Request::Subscribe {
                stream,
                topic,
                partition,
                consumer,
                start,
                prefetch,
            } => self.subscribe(stream, &topic, partition, &consumer, start, prefetch),
            Request::Credit { stream, events } => {
                if let Some((_, c)) = self.streams.get(&stream) {
                    c.grant(events);
                }
                return;
            }
            Request::Unsubscribe { stream } => {
                if let Some((task, _)) = self.streams.remove(&stream) {
                    task.abort();
                }
                Ok(Response::Done)
            }
            Request::FetchData {
                topic,
                partition,
                items,
            } => match self.partition(&topic, partition) {
                Ok(p) => {
                    let max_frame = self.state.config.max_frame_bytes;
                    let wanted = requested_bytes(&items);
                    if wanted.saturating_add(64) > max_frame as u64 {
                        let msg = format!(
                            "{wanted} bytes requested in one fetch exceed the maximum frame of {max_frame} bytes; fetch fewer ranges at a time"
                        );
                        Err(ServerError::coded(ErrorCode::FRAME_TOO_LARGE, msg))
                    } else {
                        // Stop reading this connection's requests while too much
                        // fetched data waits to be sent: a client that never
                        // reads its answers cannot grow the server.
                        let cap = self.state.config.max_connection_buffer_bytes;
                        let permits = wanted.clamp(1, cap).min(u32::MAX as u64) as u32;
                        let Ok(permit) = self.budget.clone().acquire_many_owned(permits).await
                        else {
                            return;
                        };
                        let writer = self.writer.clone();
                        tokio::spawn(async move {
                            let read = tokio::task::spawn_blocking(move || {
                                let mut out = Vec::new();
                                for (base, ranges) in &items {
                                    p.log.read_data(*base, ranges, &mut out)?;
                                }
                                Ok::<_, ServerError>(out)
                            })
                            .await;
                            let frame = match read {
                                Ok(Ok(bulk)) => {
                                    let total: u64 = bulk.iter().map(|b| b.len() as u64).sum();
                                    if total + 64 > max_frame as u64 {
                                        let msg = format!(
                                        "{total} bytes requested in one fetch exceed the maximum frame of {max_frame} bytes; fetch fewer ranges at a time"
                                    );
                                        OutFrame::response(
                                            id,
                                            &Response::error(ErrorCode::FRAME_TOO_LARGE, msg),
                                        )
                                    } else {
                                        OutFrame::response(id, &Response::Data { total })
                                            .with_bulk(bulk)
                                            .with_hold(permit)
                                    }
                                }
                                Ok(Err(e)) => OutFrame::response(
                                    id,
                                    &Response::error(e.code(), e.to_string()),
                                ),
                                Err(e) => OutFrame::response(
                                    id,
                                    &Response::error(ErrorCode::INTERNAL, e.to_string()),
                                ),
                            };
                            let _ = writer.send(frame).await;
                        });
                        return;
                    }
                }
                Err(e) => Err(e),
            },
            Request::Commit {
                topic,
                partition,
                consumer,
                offset,
            } => match self.partition(&topic, partition) {
                Ok(p) => {
                    // The fdatasync runs off the connection's read loop.
                    let writer = self.writer.clone();
                    tokio::spawn(async move {
                        let r = tokio::task::spawn_blocking(move || {
                            p.offsets.commit(&consumer, offset)?;
                            // Acked events free room in a full `block` partition.
                            p.consumer_at(&consumer, offset);
                            Ok::<_, strom_storage::StorageError>(())
                        })
                        .await;
                        let resp = match r {
                            Ok(Ok(())) => Response::Done,
                            Ok(Err(e)) => Response::error(ErrorCode(e.code()), e.to_string()),
                            Err(e) => Response::error(ErrorCode::INTERNAL, e.to_string()),
                        };
                        let _ = writer.send(OutFrame::response(id, &resp)).await;
                    });
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Scrub { topic, partition } => match self.partition(&topic, partition) {
                Ok(p) => {
                    // A full read of the partition: off the read loop.
                    let writer = self.writer.clone();
                    tokio::spawn(async move {
                        let r = tokio::task::spawn_blocking(move || p.log.verify()).await;
                        let resp = match r {
                            Ok(Ok(v)) => Response::Scrubbed {
                                segments: v.segments,
                                batches: v.batches,
                                bytes: v.bytes,
                                damaged: v.damaged,
                                quarantined: v.quarantined,
                            },
                            Ok(Err(e)) => Response::error(ErrorCode(e.code()), e.to_string()),
                            Err(e) => Response::error(ErrorCode::INTERNAL, e.to_string()),
                        };
                        let _ = writer.send(OutFrame::response(id, &resp)).await;
                    });
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Offsets { topic, partition } => self
                .partition(&topic, partition)
                .map(|p| Response::Offsets(p.offsets.all())),
            // Topics, producers and the group: the registry's operations.
            req => control::handle(&st, req).await,
        };
        self.respond(id, result);
    }

    fn subscribe(
        &mut self,
        stream: u64,
        topic: &str,
        partition: u32,
        consumer: &str,
        start: StartPos,
        prefetch: u32,
    ) -> Result<Response, ServerError> {
        let p = self.partition(topic, partition)?;
        let log = &p.log;
        let first = log.first_offset();
        let next = log.next_offset();
        let pos = match start {
            StartPos::Committed => p.offsets.get(consumer).unwrap_or(first),
            StartPos::Beginning => first,
            StartPos::End => next,
            StartPos::Offset(o) => o,
            StartPos::Timestamp(t) => log.offset_for_timestamp(t),
        }
        // Not raised to `first`: a reader asking for dropped events sees
        // the first pushed batch start past its position, an explicit gap.
        .min(next);
        p.consumer_at(consumer, pos);
        let credit = Credit::new(prefetch.clamp(1, self.state.config.max_prefetch_events));
        if let Some((old, _)) = self.streams.remove(&stream) {
            old.abort();
        }
        let task = tokio::spawn(stream::run(
            p,
            stream,
            pos,
            credit.clone(),
            self.writer.clone(),
        ));
        self.streams.insert(stream, (task, credit));
        Ok(Response::Subscribed { start_offset: pos })
    }
}
