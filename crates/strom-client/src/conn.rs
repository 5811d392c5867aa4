//! One multiplexed connection to one server member.
//!
//! Requests carry ids and may be pipelined; a reader task matches responses
//! to waiting callers and routes pushes to subscription streams. For data
//! fetches the caller lends its destination buffers, and the reader reads
//! the response's bulk payload straight into them (no intermediate copy).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use parking_lot::Mutex;
use strom_net::{spawn_writer, BoxRead, FrameReader, NetError, OutFrame, Transport, WriterHandle};
use strom_proto::{ErrorCode, FrameKind, Push, Request, Response};
use tokio::sync::oneshot;

use crate::data::DataBuffer;
use crate::error::{Error, Result};

/// Where the bytes of a data response land: `(buffer index, start, len)`
/// pieces, filled in order.
pub(crate) type FillPlan = Vec<(usize, usize, usize)>;

type Buffers = Vec<Box<dyn DataBuffer>>;

/// Receives a stream's pushes, in order, on the connection's reader task.
/// Dropping it (when the connection dies) tells the stream it is over.
pub(crate) type StreamHandler = Box<dyn FnMut(Push) + Send>;

/// Runs on the connection's reader task with a request's outcome.
pub(crate) type Callback = Box<dyn FnOnce(Result<(Response, Buffers)>) + Send>;

/// How a response reaches whoever sent the request.
enum Completion {
    Channel(oneshot::Sender<Result<(Response, Buffers)>>),
    Callback(Callback),
}

impl Completion {
    fn complete(self, r: Result<(Response, Buffers)>) {
        let r = match r {
            Ok((Response::Error { code, message }, _)) => Err(Error::Coded { code, message }),
            r => r,
        };
        match self {
            Completion::Channel(tx) => {
                let _ = tx.send(r);
            }
            Completion::Callback(f) => f(r),
        }
    }
}

struct Pending {
    done: Completion,
    buffers: Buffers,
    plan: FillPlan,
}

/// The pending response of a sent request.
pub(crate) struct ResponseWaiter {
    rx: oneshot::Receiver<Result<(Response, Buffers)>>,
    addr: String,
}

impl ResponseWaiter {
    /// Waits for the response; an error response becomes `Err`.
    pub async fn wait(self) -> Result<(Response, Buffers)> {
        match self.rx.await {
            Ok(r) => r,
            Err(_) => Err(Error::coded(
                ErrorCode::CONNECTION_CLOSED,
                format!("connection to server {} was lost", self.addr),
            )),
        }
    }
}

/// Size limits of the server at the other end, asked once per connection
/// (`Request::Limits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServerLimits {
    pub max_frame_bytes: u64,
    pub max_batch_bytes: u64,
}

pub(crate) struct ClientConn {
    pub addr: String,
    limits: OnceLock<ServerLimits>,
    writer: WriterHandle,
    pending: Mutex<HashMap<u64, Pending>>,
    streams: Mutex<HashMap<u64, StreamHandler>>,
    next_id: AtomicU64,
    dead: AtomicBool,
}

impl ClientConn {
    pub async fn connect(transport: &dyn Transport, addr: &str) -> Result<Arc<Self>> {
        let conn = transport.connect(addr).await?;
        let writer = spawn_writer(conn.writer, conn.direct, addr.to_string(), |_| {});
        let c = Arc::new(ClientConn {
            addr: addr.to_string(),
            limits: OnceLock::new(),
            writer,
            pending: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
        });
        tokio::spawn(read_loop(c.clone(), conn.reader));
        match c.call(&Request::Limits, Vec::new()).await? {
            Response::Limits {
                max_frame_bytes,
                max_batch_bytes,
            } => {
                let _ = c.limits.set(ServerLimits {
                    max_frame_bytes,
                    max_batch_bytes,
                });
            }
            other => return Err(crate::driver::unexpected(other)),
        }
        Ok(c)
    }

    /// The server's size limits, learned when the connection opened.
    pub fn limits(&self) -> Option<ServerLimits> {
        self.limits.get().copied()
    }

    /// Registers a pending request under a fresh id.
    fn register(&self, done: Completion, buffers: Buffers, plan: FillPlan) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.pending.lock().insert(
            id,
            Pending {
                done,
                buffers,
                plan,
            },
        );
        id
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.writer.is_closed()
    }

    fn closed_error(&self) -> Error {
        Error::coded(
            ErrorCode::CONNECTION_CLOSED,
            format!("connection to server {} was lost", self.addr),
        )
    }

    /// Sends a request (with bulk payload) and waits for its response.
    /// An error response becomes `Err`.
    pub async fn call(&self, req: &Request, bulk: Vec<Bytes>) -> Result<Response> {
        Ok(self.call_into(req, bulk, Vec::new(), Vec::new()).await?.0)
    }

    /// Like [`call`](Self::call), and the response's bulk payload is read
    /// into `buffers` following `plan`; the buffers are handed back.
    pub async fn call_into(
        &self,
        req: &Request,
        bulk: Vec<Bytes>,
        buffers: Buffers,
        plan: FillPlan,
    ) -> Result<(Response, Buffers)> {
        self.send(req, bulk, buffers, plan).await?.wait().await
    }

    /// Queues a request on the connection and returns a waiter for its
    /// response. Requests sent one after another by the same task go out
    /// in that order (which fixes the order of appended batches).
    pub async fn send(
        &self,
        req: &Request,
        bulk: Vec<Bytes>,
        buffers: Buffers,
        plan: FillPlan,
    ) -> Result<ResponseWaiter> {
        let (tx, rx) = oneshot::channel();
        let id = self.register(Completion::Channel(tx), buffers, plan);
        if self.is_dead()
            || self
                .writer
                .send(OutFrame::request(id, req).with_bulk(bulk))
                .await
                .is_err()
        {
            self.pending.lock().remove(&id);
            return Err(self.closed_error());
        }
        Ok(ResponseWaiter {
            rx,
            addr: self.addr.clone(),
        })
    }

    /// Sends a request (waiting for room in the connection's queue, which
    /// keeps one caller's requests in order); `done` runs on the reader task
    /// with the outcome, or here if the connection is already lost.
    pub async fn send_with(&self, req: &Request, bulk: Vec<Bytes>, done: Callback) {
        let id = self.register(Completion::Callback(done), Vec::new(), Vec::new());
        let lost = self.is_dead()
            || self
                .writer
                .send(OutFrame::request(id, req).with_bulk(bulk))
                .await
                .is_err();
        if lost {
            if let Some(p) = self.pending.lock().remove(&id) {
                p.done.complete(Err(self.closed_error()));
            }
        }
    }

    /// Queues a request from any thread without waiting; `done` runs on the
    /// reader task with the outcome (also when the connection is lost).
    /// Hands `done` back if the connection is dead or its queue is full, so
    /// the caller can fall back to [`send`](Self::send).
    pub fn try_send_with(
        &self,
        req: &Request,
        bulk: Vec<Bytes>,
        done: Callback,
    ) -> Result<(), (Vec<Bytes>, Callback)> {
        if self.is_dead() {
            return Err((bulk, done));
        }
        let id = self.register(Completion::Callback(done), Vec::new(), Vec::new());
        if self.is_dead() {
            // Lost meanwhile: if fail_all has not taken it, hand it back.
            return match self.pending.lock().remove(&id) {
                Some(Pending {
                    done: Completion::Callback(done),
                    ..
                }) => Err((bulk, done)),
                _ => Ok(()),
            };
        }
        match self
            .writer
            .try_send_frame(OutFrame::request(id, req).with_bulk(bulk))
        {
            Ok(()) => Ok(()),
            Err(frame) => match self.pending.lock().remove(&id) {
                Some(Pending {
                    done: Completion::Callback(done),
                    ..
                }) => Err((frame.bulk, done)),
                // The reader already failed it (connection lost meanwhile).
                _ => Ok(()),
            },
        }
    }

    /// Sends a request that gets no response (id 0), without waiting.
    pub fn send_oneway(&self, req: &Request) {
        let _ = self.writer.try_send(OutFrame::request(0, req));
    }

    /// Registers a push stream: `handler` gets its pushes, in order, on
    /// the reader task, and is dropped when the connection dies.
    pub fn open_stream(&self, stream: u64, handler: StreamHandler) {
        if !self.is_dead() {
            self.streams.lock().insert(stream, handler);
        }
    }

    pub fn close_stream(&self, stream: u64) {
        self.streams.lock().remove(&stream);
    }

    fn fail_all(&self, why: &str) {
        self.dead.store(true, Ordering::Release);
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, p) in pending {
            p.done.complete(Err(Error::coded(
                ErrorCode::CONNECTION_CLOSED,
                format!("connection to server {} was lost: {why}", self.addr),
            )));
        }
        self.streams.lock().clear();
    }
}

async fn read_loop(conn: Arc<ClientConn>, mut reader: FrameReader<BoxRead>) {
    let why = loop {
        match read_one(&conn, &mut reader).await {
            Ok(true) => {}
            Ok(false) => break "closed by the server".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    tracing::debug!(addr = %conn.addr, reason = %why, "connection ended");
    conn.fail_all(&why);
}

async fn read_one(conn: &ClientConn, reader: &mut FrameReader<BoxRead>) -> Result<bool, NetError> {
    let Some((h, body)) = reader.next().await? else {
        return Ok(false);
    };
    match h.kind {
        FrameKind::Response => {
            let resp = Response::decode(h.opcode, &body)?;
            let pending = conn.pending.lock().remove(&h.id);
            let Some(mut p) = pending else {
                reader.skip_bulk().await?;
                return Ok(true);
            };
            if let Response::Error { .. } = resp {
                // A refused request carries no data, whatever was planned.
                reader.skip_bulk().await?;
                p.done.complete(Ok((resp, p.buffers)));
                return Ok(true);
            }
            let planned: u64 = p.plan.iter().map(|x| x.2 as u64).sum();
            if reader.pending_bulk() > 0 || planned > 0 {
                if reader.pending_bulk() != planned {
                    let e = NetError::BulkMismatch {
                        announced: reader.pending_bulk(),
                        expected: planned,
                    };
                    p.done.complete(Err(Error::coded(e.code(), e.to_string())));
                    return Err(e);
                }
                for &(idx, start, len) in &p.plan {
                    let buf = p.buffers[idx].as_mut_slice();
                    reader.read_bulk_into(&mut buf[start..start + len]).await?;
                }
            }
            p.done.complete(Ok((resp, p.buffers)));
        }
        FrameKind::Push => {
            let push = Push::decode(h.opcode, &body)?;
            reader.skip_bulk().await?;
            if let Some(handler) = conn.streams.lock().get_mut(&h.id) {
                handler(push);
            }
        }
        FrameKind::Request => {
            return Err(NetError::Proto(strom_proto::ProtoError::Unknown {
                what: "frame kind from a server",
                value: 0,
            }))
        }
    }
    Ok(true)
}
