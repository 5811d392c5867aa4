//! One connection to one server member, typed.
//!
//! The multiplexing itself (request ids, pipelining, the reader task,
//! push routing, bulk reads straight into lent buffers) is
//! [`strom_net::MuxConn`], which works on frames. This layer encodes
//! requests, decodes responses and pushes, turns error responses and
//! connection loss into [`Error`]s, and learns the server's limits when the
//! connection opens.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use strom_net::{Complete, LentBuffer, MuxConn, NetError, OutFrame, Reply, Transports};
use strom_proto::{ErrorCode, Push, Request, Response, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

use crate::data::DataBuffer;
use crate::error::{Error, Result};

/// Where the bytes of a data response land: `(buffer index, start, len)`
/// pieces, filled in order.
pub(crate) type FillPlan = strom_net::FillPlan;

type Buffer = Box<dyn DataBuffer>;
type Buffers = Vec<Buffer>;

impl LentBuffer for Box<dyn DataBuffer> {
    fn bulk_dst(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// Receives a stream's pushes, in order, on the connection's reader task.
/// Dropping it (when the connection dies) tells the stream it is over.
pub(crate) type StreamHandler = Box<dyn FnMut(Push) + Send>;

/// Runs on the connection's reader task with a request's outcome.
pub(crate) type Callback = Box<dyn FnOnce(Result<(Response, Buffers)>) + Send>;

/// A [`Callback`] as the multiplexer's completion: decodes on the reader
/// task, with no extra allocation per request.
struct Typed(Callback);

impl Complete<Buffer> for Typed {
    fn complete(self, outcome: Result<Reply<Buffer>, NetError>) -> Result<(), NetError> {
        let (typed, malformed) = decode(outcome);
        (self.0)(typed);
        malformed.map_or(Ok(()), Err)
    }
}

/// The typed outcome of a request, and the error that should end the
/// connection if the response was malformed.
fn decode(
    outcome: Result<Reply<Buffer>, NetError>,
) -> (Result<(Response, Buffers)>, Option<NetError>) {
    let reply = match outcome {
        Ok(reply) => reply,
        Err(e) => return (Err(net_error(e)), None),
    };
    match Response::decode(reply.header.version, reply.header.opcode, &reply.body) {
        Ok(Response::Error { code, message }) => (Err(Error::Coded { code, message }), None),
        Ok(resp) => (Ok((resp, reply.buffers)), None),
        Err(e) => (Err(Error::Proto(e.clone())), Some(NetError::Proto(e))),
    }
}

/// A transport error as the client reports it.
fn net_error(e: NetError) -> Error {
    match e {
        NetError::Lost { peer, cause } => Error::coded(
            ErrorCode::CONNECTION_CLOSED,
            format!("connection to server {peer} was lost: {cause}"),
        ),
        e => Error::coded(e.code(), e.to_string()),
    }
}

/// The pending response of a sent request.
pub(crate) struct ResponseWaiter {
    waiter: strom_net::Waiter<Buffer>,
    mux: Arc<MuxConn<Buffer, Typed>>,
    planned: u64,
}

impl ResponseWaiter {
    /// Waits for the response; an error response becomes `Err`.
    pub async fn wait(self) -> Result<(Response, Buffers)> {
        let outcome = self.waiter.wait().await;
        let bulk_len = outcome.as_ref().map_or(0, |r| r.header.bulk_len);
        let (typed, malformed) = decode(outcome);
        if let Some(e) = malformed {
            self.mux.kill(e);
        }
        let (resp, buffers) = typed?;
        // A data answer must bring every planned byte (only an error
        // response may come back unfilled).
        if bulk_len != self.planned {
            let mismatch = || NetError::BulkMismatch {
                announced: bulk_len,
                expected: self.planned,
            };
            self.mux.kill(mismatch());
            return Err(net_error(mismatch()));
        }
        Ok((resp, buffers))
    }
}

/// Size limits of the server at the other end, asked once per connection
/// (`Request::Limits`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ServerLimits {
    pub max_frame_bytes: u64,
    pub max_batch_bytes: u64,
}

/// What the server said about its group when the connection opened: the
/// master it knows of (`u32::MAX`: none, an election is in progress) and
/// the members with their addresses.
#[derive(Clone, Debug, Default)]
pub(crate) struct Greeting {
    /// The answering server's member id.
    pub member: u32,
    pub master: u32,
    pub members: Vec<strom_proto::GroupMember>,
    /// Voters of the server's metadata quorum (`Limits`; 0 from servers
    /// older than protocol version 8, 1 without a quorum).
    pub meta_voters: u32,
    /// The server's security mode (`Limits.security`; 0 from servers
    /// older than protocol version 9).
    pub security: u8,
}

pub(crate) struct ClientConn {
    limits: OnceLock<ServerLimits>,
    greeting: OnceLock<Greeting>,
    /// The protocol version settled by `Hello` (requests are encoded at it).
    version: AtomicU8,
    mux: Arc<MuxConn<Buffer, Typed>>,
}

impl ClientConn {
    /// Connects to `addr` (through the transport its scheme names) and
    /// learns the server's limits.
    pub async fn connect(
        transports: &Transports,
        addr: &str,
        token: Option<&str>,
    ) -> Result<Arc<Self>> {
        let conn = transports.connect(addr).await?;
        let c = Arc::new(ClientConn {
            limits: OnceLock::new(),
            greeting: OnceLock::new(),
            version: AtomicU8::new(MIN_PROTOCOL_VERSION),
            mux: MuxConn::start_with(conn, addr, transports.busy_poll()),
        });
        let hello = Request::Hello {
            client: format!("strom-client {}", env!("CARGO_PKG_VERSION")),
            max_version: PROTOCOL_VERSION,
            nonce: Default::default(),
        };
        let mut greeting = match c.call(&hello, Vec::new()).await? {
            Response::Hello {
                version,
                member,
                master,
                members,
                ..
            } if (MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) => {
                c.version.store(version, Ordering::Release);
                Greeting {
                    member,
                    master,
                    members,
                    meta_voters: 0,
                    security: 0,
                }
            }
            Response::Hello { version, .. } => {
                return Err(Error::coded(
                    ErrorCode::UNSUPPORTED_VERSION,
                    format!("server {addr} chose protocol version {version}; this client speaks {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"),
                ))
            }
            other => return Err(crate::error::unexpected(other)),
        };
        match c.call(&Request::Limits, Vec::new()).await? {
            Response::Limits {
                max_frame_bytes,
                max_batch_bytes,
                meta_voters,
                security,
            } => {
                greeting.meta_voters = meta_voters;
                greeting.security = security;
                let _ = c.limits.set(ServerLimits {
                    max_frame_bytes,
                    max_batch_bytes,
                });
            }
            other => return Err(crate::error::unexpected(other)),
        }
        let _ = c.greeting.set(greeting);
        if let Some(token) = token {
            c.authenticate(addr, token).await?;
        }
        Ok(c)
    }

    /// Presents `token` (`crate::credentials`); the server answers with
    /// the principal this connection is from now on.
    async fn authenticate(&self, addr: &str, token: &str) -> Result<()> {
        if self.version() < 9 {
            return Err(Error::coded(
                ErrorCode::UNAUTHENTICATED,
                format!(
                    "server {addr} is too old to take a token (protocol version {})",
                    self.version()
                ),
            ));
        }
        let req = Request::Authenticate {
            token: token.to_string(),
        };
        match self.call(&req, Vec::new()).await? {
            Response::Authenticated { principal } => {
                tracing::debug!(addr, principal, "authenticated");
                Ok(())
            }
            other => Err(crate::error::unexpected(other)),
        }
    }

    /// The protocol version of this connection.
    pub fn version(&self) -> u8 {
        self.version.load(Ordering::Acquire)
    }

    /// What the server said about its group when the connection opened.
    pub fn greeting(&self) -> Greeting {
        self.greeting.get().cloned().unwrap_or_default()
    }

    /// The server's size limits, learned when the connection opened.
    pub fn limits(&self) -> Option<ServerLimits> {
        self.limits.get().copied()
    }

    pub fn is_dead(&self) -> bool {
        self.mux.is_dead()
    }

    /// Requests (of every user of the connection) waiting for an answer.
    pub fn in_flight(&self) -> usize {
        self.mux.in_flight()
    }

    /// Fails every request waiting on this connection if it has some and
    /// the server has said nothing for `silence` (a server that stopped, as
    /// a SIGSTOPped one does, without closing its connections). True if
    /// it did.
    pub fn drop_if_silent(&self, silence: std::time::Duration) -> bool {
        if self.mux.is_dead() || self.mux.in_flight() == 0 || self.mux.silent_for() < silence {
            return false;
        }
        self.abandon(format!(
            "waiting {silence:?} for a server that said nothing"
        ));
        true
    }

    /// Gives the connection up (`why`: what it waited for in vain): every
    /// request waiting on it fails as on a lost connection, and the next
    /// user of the server opens a new one.
    pub fn abandon(&self, why: String) {
        self.mux.kill(NetError::io(
            why,
            std::io::Error::from(std::io::ErrorKind::TimedOut),
        ));
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
        let planned = plan.iter().map(|p| p.2 as u64).sum();
        let frame = OutFrame::request(self.version(), 0, req).with_bulk(bulk);
        let waiter = self
            .mux
            .send(frame, buffers, plan)
            .await
            .map_err(net_error)?;
        Ok(ResponseWaiter {
            waiter,
            mux: self.mux.clone(),
            planned,
        })
    }

    /// Sends a request (waiting for room in the connection's queue, which
    /// keeps one caller's requests in order); `done` runs on the reader task
    /// with the outcome, or here if the connection is already lost.
    /// `rest` is the request's `@rest` field (a batch's metadata section)
    /// in pieces written as they are; `req`'s own rest field is empty.
    pub async fn send_with(
        &self,
        req: &Request,
        rest: Vec<Bytes>,
        bulk: Vec<Bytes>,
        done: Callback,
    ) {
        let frame = OutFrame::request_with_rest(self.version(), 0, req, rest).with_bulk(bulk);
        self.mux.send_with(frame, Typed(done)).await;
    }

    /// Queues a request from any thread without waiting; `done` runs on the
    /// reader task with the outcome (also when the connection is lost).
    /// Hands `done` back if the connection is dead or its queue is full, so
    /// the caller can fall back to [`send`](Self::send).
    pub fn try_send_with(
        &self,
        req: &Request,
        rest: Vec<Bytes>,
        bulk: Vec<Bytes>,
        done: Callback,
    ) -> Result<(), (Vec<Bytes>, Callback)> {
        if self.is_dead() {
            return Err((bulk, done));
        }
        let frame = OutFrame::request_with_rest(self.version(), 0, req, rest).with_bulk(bulk);
        self.mux
            .try_send_with(frame, Typed(done))
            .map_err(|(frame, Typed(done))| (frame.bulk, done))
    }

    /// Sends a request that gets no response (id 0), without waiting.
    pub fn send_oneway(&self, req: &Request) {
        let _ = self
            .mux
            .send_oneway(OutFrame::request(self.version(), 0, req));
    }

    /// Registers a push stream: `handler` gets its pushes, in order, on
    /// the reader task, and is dropped when the connection dies. A push
    /// that does not decode ends the connection.
    pub fn open_stream(&self, stream: u64, mut handler: StreamHandler) {
        self.mux.open_stream(
            stream,
            Box::new(move |header, body| {
                handler(Push::decode(header.version, header.opcode, &body)?);
                Ok(())
            }),
        );
    }

    pub fn close_stream(&self, stream: u64) {
        self.mux.close_stream(stream);
    }

    /// Waits on the calling thread for this connection's next frames and
    /// routes them there ([`MuxConn::read_here`]).
    pub fn read_here(
        &self,
        bell: &Arc<strom_net::Bell>,
        deadline: Option<std::time::Instant>,
    ) -> strom_net::ReadHere {
        self.mux.read_here(bell, deadline)
    }
}
