//! The native protocol front end: one task per client connection that
//! reads frames, decodes requests, calls the service layer
//! ([`crate::service`]) and encodes the answers. Nothing below this module
//! sees a wire message, except the member requests the master sends.
//!
//! - `mod.rs`: the connection loop (handshake and frame timeouts, the
//!   per-connection buffer budget, malformed frames).
//! - `data.rs`: produce, subscribe, credit, fetch, commit, scrub, offsets.
//! - `control.rs`: hello, limits, the registry, member requests.
//! - `stream.rs`: subscriptions pushed to the client (one kind of sink).
//! - `trust.rs`: the member handshake, and which requests need a member.
//!
//! Produce requests are queued to their partition manager in the order they
//! arrive (which fixes their offsets) and answered when the append is done.
//! A malformed frame gets an error response, closes this connection and is
//! logged; other connections carry on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use strom_net::spin::busy_poll;
use strom_net::{spawn_writer, Conn, NetError, OutFrame, WriterHandle};
use strom_proto::{ErrorCode, FrameKind, Request, Response, MIN_PROTOCOL_VERSION};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::batch::ValidBatch;
use crate::error::ServerError;
use crate::partition::PartitionManager;
use crate::service::{ReplicaFetch, Services};
use crate::sink::Credit;

mod authn;
mod control;
mod data;
mod group;
mod stream;
mod trust;

struct Session {
    svc: Arc<Services>,
    /// The protocol version of this connection's frames, settled by `Hello`.
    version: u8,
    writer: WriterHandle,
    peer: String,
    partitions: HashMap<(String, u32), Arc<PartitionManager>>,
    streams: HashMap<u64, (JoinHandle<()>, Arc<Credit>)>,
    /// Bytes of fetched data read for this connection and not yet written.
    budget: Arc<Semaphore>,
    /// Bytes of produced batches whose answers a quota holds: past
    /// `max_connection_buffer_bytes` the loop reads no more requests until
    /// answers go, so a client that does not wait for its answers is held
    /// at its quota too.
    throttled: Arc<Semaphore>,
    /// The append of this connection's last large batch, running on the
    /// blocking pool while the loop receives the next request. Every
    /// request waits for it first, so requests take effect in the order
    /// they came, and at most one batch is being written per connection.
    appending: Option<JoinHandle<()>>,
    /// The member id this connection proved (`member_auth::NO_ID`: it
    /// holds the secret but has not joined yet); `None`: anonymous.
    member: Option<u32>,
    /// `(ours, theirs)`: the nonces of the last `Hello` that carried one,
    /// until a `ProveMember` uses them.
    nonces: Option<(bytes::Bytes, bytes::Bytes)>,
    /// Who this connection is (`authn.rs`): every request is decided for it.
    principal: strom_auth::Principal,
}

/// One decoded request, with its checked batch if it is a `Produce`.
type Incoming = (strom_proto::FrameHeader, Request, Option<ValidBatch>);

pub async fn serve(conn: Conn, svc: Arc<Services>, _slot: OwnedSemaphorePermit) {
    let peer = conn.peer.clone();
    let principal = authn::initial(&conn.identity);
    let writer = spawn_writer(conn.writer, conn.direct, peer.clone(), |_| {});
    let mut reader = conn.reader;
    let cfg = &svc.config;
    let handshake = Instant::now() + Duration::from_millis(cfg.handshake_timeout_ms);
    let frame_timeout = Duration::from_millis(cfg.frame_timeout_ms);
    let spin = Duration::from_micros(cfg.busy_poll_us);
    let budget = Arc::new(Semaphore::new(cfg.max_connection_buffer_bytes as usize));
    let mut s = Session {
        svc: svc.clone(),
        version: MIN_PROTOCOL_VERSION,
        writer,
        peer: peer.clone(),
        partitions: HashMap::new(),
        streams: HashMap::new(),
        budget,
        throttled: Arc::new(Semaphore::new(cfg.max_connection_buffer_bytes as usize)),
        appending: None,
        member: None,
        nonces: None,
        principal,
    };
    tracing::debug!(peer = %peer, "connection opened");
    svc.stats.connection_opened();
    let mut first = true;
    loop {
        // Idle between frames is fine, except before the first one; once a
        // frame has begun, all of it must arrive in bounded time.
        let deadline = if first {
            handshake
        } else {
            match busy_poll(reader.ready(), spin).await {
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
        s.dispatch(header.id, header.version, req, batch).await;
    }
    s.appended().await;
    for (_, (task, _)) in s.streams.drain() {
        task.abort();
    }
    svc.stats.connection_closed();
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
    let req = Request::decode(header.version, header.opcode, &body)
        .map_err(|e| (id, NetError::Proto(e)))?;
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

impl Session {
    /// Waits for the pipelined append of the previous large batch, if any.
    async fn appended(&mut self) {
        if let Some(task) = self.appending.take() {
            if let Err(e) = task.await {
                tracing::error!(peer = %self.peer, error = %e, "a pipelined append task failed");
            }
        }
    }

    /// Answers a malformed frame with an error, and logs it; the caller closes.
    async fn reject(&self, id: u64, e: &NetError) {
        if matches!(e, NetError::Closed) || matches!(e, NetError::Io { .. }) {
            tracing::debug!(peer = %self.peer, error = %e, "connection lost");
            return;
        }
        tracing::warn!(peer = %self.peer, error = %e, "closing connection after a malformed frame");
        self.svc.stats.error(e.code().0);
        let _ = self
            .writer
            .send(OutFrame::response(
                self.version,
                id,
                &Response::error(e.code(), e.to_string()),
            ))
            .await;
    }

    /// A hosted partition, cached for this connection's later requests.
    fn partition(
        &mut self,
        topic: &str,
        partition: u32,
    ) -> Result<Arc<PartitionManager>, ServerError> {
        let key = (topic.to_string(), partition);
        if let Some(p) = self.partitions.get(&key).filter(|p| !p.is_deleted()) {
            return Ok(p.clone());
        }
        let p = self.svc.data.partition(topic, partition)?;
        self.partitions.insert(key, p.clone());
        Ok(p)
    }

    /// Queues the answer to request `id` (none for one-way requests, id 0).
    fn respond(&self, id: u64, result: Result<Response, ServerError>) {
        let resp = result.unwrap_or_else(|e| failure(&self.svc, &e));
        if id == 0 {
            if let Response::Error { message, .. } = &resp {
                tracing::debug!(peer = %self.peer, error = %message, "one-way request failed");
            }
            return;
        }
        answer(&self.writer, self.version, id, resp);
    }

    /// Runs `op` off the read loop and sends its answer to request `id`.
    fn respond_later<F>(&self, id: u64, op: F)
    where
        F: std::future::Future<Output = Result<Response, ServerError>> + Send + 'static,
    {
        let writer = self.writer.clone();
        let version = self.version;
        let svc = self.svc.clone();
        tokio::spawn(async move {
            let resp = op.await.unwrap_or_else(|e| failure(&svc, &e));
            let _ = writer.send(OutFrame::response(version, id, &resp)).await;
        });
    }

    async fn dispatch(&mut self, id: u64, version: u8, req: Request, batch: Option<ValidBatch>) {
        self.appended().await;
        if let Err(e) = self.admit(&req) {
            tracing::warn!(peer = %self.peer, opcode = req.opcode(), error = %e, "refused a member request");
            return self.respond(id, Err(e));
        }
        if let Err(e) = self.authorize(&req) {
            return self.respond(id, Err(e));
        }
        match req {
            Request::Produce {
                topic,
                partition,
                acks_all,
                ..
            } => self.produce(id, &topic, partition, acks_all, batch).await,
            Request::ReplicaFetch {
                topic,
                partition,
                epoch,
                follower,
                from,
                last_epoch,
                max_bytes,
            } => {
                // The follower is the member this connection proved
                // (`admit` refused a fetch that names another).
                let follower = self.member.unwrap_or(follower);
                let svc = self.svc.clone();
                self.respond_later(id, async move {
                    let fetch = ReplicaFetch {
                        topic,
                        partition,
                        epoch,
                        follower,
                        from,
                        last_epoch,
                        max_bytes,
                    };
                    svc.data.replica_fetch(fetch).await
                });
            }
            Request::Subscribe {
                stream,
                topic,
                partition,
                consumer,
                start,
                prefetch,
            } => {
                let r = self.subscribe(stream, &topic, partition, &consumer, start, prefetch);
                self.respond(id, r);
            }
            Request::Credit { stream, events } => self.credit(stream, events),
            Request::Unsubscribe { stream } => {
                self.unsubscribe(stream);
                self.respond(id, Ok(Response::Done));
            }
            Request::FetchData {
                topic,
                partition,
                items,
            } => self.fetch(id, &topic, partition, items).await,
            Request::Commit {
                topic,
                partition,
                consumer,
                offset,
            } => self.commit(id, &topic, partition, consumer, offset),
            Request::Scrub { topic, partition } => self.scrub(id, &topic, partition),
            Request::GroupSubscribe {
                stream,
                spec,
                partition,
                consumer,
                epoch,
                prefetch,
            } => {
                let r = self
                    .group_subscribe(stream, &spec, partition, consumer, epoch, prefetch)
                    .await;
                self.respond(id, r);
            }
            Request::GroupCommit {
                topic,
                partition,
                group,
                consumer,
                epoch,
                offset,
            } => self.group_commit(id, &topic, partition, group, consumer, epoch, offset),
            Request::GroupAck {
                topic,
                partition,
                group,
                acks,
                nacks,
            } => self.group_ack(id, &topic, partition, &group, acks, nacks),
            Request::Offsets { topic, partition } => {
                let r = self
                    .partition(&topic, partition)
                    .map(|p| Response::Offsets(self.svc.data.offsets(&p)));
                self.respond(id, r);
            }
            Request::Hello {
                client,
                max_version,
                nonce,
            } => self.hello(id, version, &client, max_version, nonce).await,
            Request::ProveMember { member, proof } => self.prove_member(id, member, &proof),
            Request::Authenticate { token } => self.authenticate(id, &token),
            Request::Limits => self.respond(id, Ok(self.limits())),
            Request::ServerSnapshot => {
                let svc = self.svc.clone();
                self.respond_later(id, async move {
                    let json = serde_json::to_string(&svc.snapshot().await)
                        .map_err(|e| ServerError::coded(ErrorCode::INTERNAL, e.to_string()))?;
                    Ok(Response::ServerSnapshot { json })
                });
            }
            // Topics, producers and the group: the control operations.
            req => {
                let changes = crate::service::access::changes(&req);
                let r = control::handle(&self.svc.control, self.member, req).await;
                if r.is_ok() {
                    self.audit(&changes);
                }
                self.respond(id, r.map(|resp| self.filter_listing(resp)));
            }
        }
    }
}

/// The error answer for `e`, counted by its code for the metrics tap.
pub(crate) fn failure(svc: &Services, e: &ServerError) -> Response {
    svc.stats.error(e.code().0);
    Response::error(e.code(), e.to_string())
}

/// Queues a response; only a full queue needs a task to wait for room.
fn answer(writer: &WriterHandle, version: u8, id: u64, resp: Response) {
    if let Err(frame) = writer.try_send_frame(OutFrame::response(version, id, &resp)) {
        let writer = writer.clone();
        tokio::spawn(async move {
            let _ = writer.send(frame).await;
        });
    }
}
