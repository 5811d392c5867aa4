//! A multiplexed connection, at the frame level.
//!
//! [`MuxConn`] lets many requests be in flight on one connection. It gives
//! each request a fresh id and keeps its completion in a pending map; a
//! reader task matches response frames to completions by id and routes
//! push frames to stream handlers by stream id. Callers get each frame as
//! it arrived, `(FrameHeader, body)`, and encode and decode messages
//! themselves: this module never looks inside a body.
//!
//! **Bulk into lent buffers.** A request may lend buffers and a
//! [`FillPlan`] for its response's bulk payload. If the response announces
//! exactly the planned bytes, the reader reads them straight into the
//! buffers (no intermediate copy). If it announces none (an error
//! response), the buffers come back unfilled. Anything else is
//! [`NetError::BulkMismatch`] and ends the connection.
//!
//! **Completions** are either a [`Waiter`] (a task awaits it) or a
//! [`Complete`] value that runs on the reader task, which is how a producer
//! settles a batch without a task hop. [`MuxConn::try_send_with`] queues a
//! request from any thread without waiting.
//!
//! **Who reads.** The reader task reads the socket; on a socket a thread
//! can read too ([`crate::DirectRead`]: TCP, and shm's frame stream), the
//! task holds the frame reader only while frames arrive, and a thread
//! that waits for something this connection brings may take it and read
//! the socket itself ([`MuxConn::read_here`], `here.rs`): the kernel then
//! wakes that thread, with no hand-off from the runtime's.
//!
//! **Loss.** When the connection ends (the peer closed it, a read or write
//! failed, a frame was malformed, or [`MuxConn::kill`]), every pending
//! request fails with [`NetError::Lost`] and every stream handler is
//! dropped, which tells its stream that it is over.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use strom_proto::{FrameHeader, FrameKind, ProtoError};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::bell::Bell;
use crate::socket::DirectRead;
use crate::spin;
use crate::{spawn_writer, BoxRead, Conn, FrameReader, NetError, OutFrame, WriterHandle};
use std::future::Future;

/// Where the bulk bytes of a response land: `(buffer index, start, len)`
/// pieces, filled in order.
pub type FillPlan = Vec<(usize, usize, usize)>;

/// Memory a caller lends to a request, for its response's bulk payload.
pub trait LentBuffer: Send + 'static {
    /// The bytes the fill plan indexes into.
    fn bulk_dst(&mut self) -> &mut [u8];
}

impl LentBuffer for Vec<u8> {
    fn bulk_dst(&mut self) -> &mut [u8] {
        self
    }
}

impl LentBuffer for BytesMut {
    fn bulk_dst(&mut self) -> &mut [u8] {
        self
    }
}

/// A response, as it arrived, with the buffers the request lent (filled if
/// and only if `header.bulk_len > 0`).
pub struct Reply<B> {
    pub header: FrameHeader,
    pub body: Bytes,
    pub buffers: Vec<B>,
}

impl<B> Reply<B> {
    /// Whether the response's bulk payload was read into the buffers.
    pub fn filled(&self) -> bool {
        self.header.bulk_len > 0
    }
}

/// What a request's outcome is handed to on the reader task.
pub trait Complete<B>: Send + 'static {
    /// Takes the outcome. An `Err` returned here (the caller found the
    /// response malformed) ends the connection with that error.
    fn complete(self, outcome: Result<Reply<B>, NetError>) -> Result<(), NetError>;
}

/// The plain completion: a boxed closure.
pub type Callback<B> = Box<dyn FnOnce(Result<Reply<B>, NetError>) + Send>;

impl<B: 'static> Complete<B> for Callback<B> {
    fn complete(self, outcome: Result<Reply<B>, NetError>) -> Result<(), NetError> {
        self(outcome);
        Ok(())
    }
}

/// Gets a stream's pushes, in order, on the reader task. An `Err` ends the
/// connection (a malformed push). It must not call back into the
/// connection's stream methods (`open_stream`, `close_stream`).
pub type PushHandler = Box<dyn FnMut(FrameHeader, Bytes) -> Result<(), NetError> + Send>;

enum Completion<B, C> {
    Waiter(oneshot::Sender<Result<Reply<B>, NetError>>),
    Callback(C),
}

impl<B: LentBuffer, C: Complete<B>> Completion<B, C> {
    fn complete(self, outcome: Result<Reply<B>, NetError>) -> Result<(), NetError> {
        match self {
            Completion::Waiter(tx) => {
                let _ = tx.send(outcome);
                Ok(())
            }
            Completion::Callback(c) => c.complete(outcome),
        }
    }
}

struct Pending<B, C> {
    done: Completion<B, C>,
    buffers: Vec<B>,
    plan: FillPlan,
    planned: u64,
}

/// The response of a request sent with [`MuxConn::send`].
pub struct Waiter<B> {
    id: u64,
    rx: oneshot::Receiver<Result<Reply<B>, NetError>>,
    peer: Arc<str>,
}

impl<B> Waiter<B> {
    /// The request id (for [`MuxConn::cancel`]).
    pub fn id(&self) -> u64 {
        self.id
    }

    pub async fn wait(self) -> Result<Reply<B>, NetError> {
        match self.rx.await {
            Ok(outcome) => outcome,
            // Cancelled, or the connection went away without an answer.
            Err(_) => Err(NetError::Lost {
                peer: self.peer.to_string(),
                cause: Arc::new(NetError::Closed),
            }),
        }
    }
}

/// One connection carrying many requests, responses and push streams.
/// `B` is the buffer type requests lend, `C` the completion type of
/// callback requests.
pub struct MuxConn<B: LentBuffer = Vec<u8>, C: Complete<B> = Callback<B>> {
    peer: Arc<str>,
    writer: WriterHandle,
    pending: Mutex<HashMap<u64, Pending<B, C>>>,
    streams: Mutex<HashMap<u64, PushHandler>>,
    next_id: AtomicU64,
    dead: AtomicBool,
    reader: OnceLock<AbortHandle>,
    /// The same socket, for a thread that reads it itself (None: only the
    /// reader task reads, holding the frame reader for good).
    pub(crate) direct_read: Option<Arc<dyn DirectRead>>,
    /// The frame reader while nobody reads (shared sockets only).
    pub(crate) idle_reader: Mutex<Option<FrameReader<BoxRead>>>,
    /// Threads waiting for the frame reader, rung when it is free.
    pub(crate) want_reader: Mutex<Vec<Arc<Bell>>>,
    /// Set when the reader task, woken by bytes, found the reader taken
    /// (and so let go of that readiness); the thread that gives the reader
    /// back next routes what is there (`here.rs`).
    pub(crate) task_missed: AtomicBool,
    /// When the connection started, and how long after that the last
    /// frame came in (milliseconds).
    born: std::time::Instant,
    last_heard_ms: AtomicU64,
}

impl<B: LentBuffer, C: Complete<B>> MuxConn<B, C> {
    /// Starts the connection's writer and reader tasks (on the current
    /// tokio runtime). `peer` names the other end in errors and logs.
    pub fn start(conn: Conn, peer: &str) -> Arc<Self> {
        Self::start_with(conn, peer, Duration::ZERO)
    }

    /// [`MuxConn::start`], with a reader that busy-polls for `busy_poll`
    /// after each frame before its thread may sleep ([`crate::spin`]).
    pub fn start_with(conn: Conn, peer: &str, busy_poll: Duration) -> Arc<Self> {
        let Conn {
            reader,
            writer,
            direct,
            direct_read,
            ..
        } = conn;
        let mux = Arc::new_cyclic(|weak: &std::sync::Weak<Self>| {
            let weak = weak.clone();
            let writer = spawn_writer(writer, direct, peer.to_string(), move |e| {
                if let (Some(e), Some(mux)) = (e, weak.upgrade()) {
                    mux.kill(e);
                }
            });
            MuxConn {
                peer: peer.into(),
                writer,
                pending: Mutex::new(HashMap::new()),
                streams: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                dead: AtomicBool::new(false),
                reader: OnceLock::new(),
                direct_read,
                idle_reader: Mutex::new(None),
                want_reader: Mutex::new(Vec::new()),
                task_missed: AtomicBool::new(false),
                born: std::time::Instant::now(),
                last_heard_ms: AtomicU64::new(0),
            }
        });
        let task = tokio::spawn(read_loop(mux.clone(), reader, busy_poll));
        let _ = mux.reader.set(task.abort_handle());
        mux
    }

    /// The name of the other end.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.writer.is_closed()
    }

    /// Requests waiting for their response.
    pub fn in_flight(&self) -> usize {
        self.pending.lock().len()
    }

    /// How long since the other end last sent a frame (or since the
    /// connection opened, if it never did).
    pub fn silent_for(&self) -> Duration {
        let heard = Duration::from_millis(self.last_heard_ms.load(Ordering::Relaxed));
        self.born.elapsed().saturating_sub(heard)
    }

    fn lost(&self) -> NetError {
        NetError::Lost {
            peer: self.peer.to_string(),
            cause: Arc::new(NetError::Closed),
        }
    }

    /// A frame this connection could never write (too large) fails alone,
    /// instead of stopping the writer and with it every other request.
    fn check_size(&self, frame: &OutFrame) -> Result<(), NetError> {
        let len = 20 + frame.body_len() + frame.bulk_len();
        let max = self.writer.max_frame();
        if len > max as u64 {
            return Err(NetError::Proto(ProtoError::FrameTooLarge { len, max }));
        }
        Ok(())
    }

    fn register(&self, done: Completion<B, C>, buffers: Vec<B>, plan: FillPlan) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let planned = plan.iter().map(|p| p.2 as u64).sum();
        let pending = Pending {
            done,
            buffers,
            plan,
            planned,
        };
        self.pending.lock().insert(id, pending);
        id
    }

    /// Queues a request (waiting for room in the connection's queue, which
    /// keeps one task's requests in order) and returns a waiter for its
    /// response, whose bulk payload is read into `buffers` following
    /// `plan`. The frame's id is set here.
    pub async fn send(
        &self,
        mut frame: OutFrame,
        buffers: Vec<B>,
        plan: FillPlan,
    ) -> Result<Waiter<B>, NetError> {
        self.check_size(&frame)?;
        let (tx, rx) = oneshot::channel();
        let id = self.register(Completion::Waiter(tx), buffers, plan);
        frame.id = id;
        if self.is_dead() || self.writer.send(frame).await.is_err() {
            self.pending.lock().remove(&id);
            return Err(self.lost());
        }
        Ok(Waiter {
            id,
            rx,
            peer: self.peer.clone(),
        })
    }

    /// Sends a request and waits for its response (no bulk expected).
    pub async fn call(&self, frame: OutFrame) -> Result<Reply<B>, NetError> {
        self.send(frame, Vec::new(), Vec::new()).await?.wait().await
    }

    /// Sends a request, waiting for room in the queue; `done` gets the
    /// outcome on the reader task, or here if the request cannot be sent.
    pub async fn send_with(&self, mut frame: OutFrame, done: C) {
        if let Err(e) = self.check_size(&frame) {
            let _ = done.complete(Err(e));
            return;
        }
        let id = self.register(Completion::Callback(done), Vec::new(), Vec::new());
        frame.id = id;
        let lost = self.is_dead() || self.writer.send(frame).await.is_err();
        if lost {
            if let Some(p) = self.pending.lock().remove(&id) {
                let _ = p.done.complete(Err(self.lost()));
            }
        }
    }

    /// Queues a request from any thread without waiting; `done` gets the
    /// outcome on the reader task (also when the connection is lost).
    /// Hands the frame and `done` back if the connection is dead, the frame
    /// too large, or the queue full, so the caller can fall back to
    /// [`send_with`](Self::send_with).
    pub fn try_send_with(&self, mut frame: OutFrame, done: C) -> Result<(), (OutFrame, C)> {
        if self.is_dead() || self.check_size(&frame).is_err() {
            return Err((frame, done));
        }
        let id = self.register(Completion::Callback(done), Vec::new(), Vec::new());
        frame.id = id;
        if self.is_dead() {
            // Lost meanwhile: unless the reader already failed it, hand it back.
            return match self.take_callback(id) {
                Some(done) => Err((frame, done)),
                None => Ok(()),
            };
        }
        match self.writer.try_send_frame(frame) {
            Ok(()) => Ok(()),
            Err(frame) => match self.take_callback(id) {
                Some(done) => Err((frame, done)),
                None => Ok(()),
            },
        }
    }

    fn take_callback(&self, id: u64) -> Option<C> {
        match self.pending.lock().remove(&id) {
            Some(Pending {
                done: Completion::Callback(done),
                ..
            }) => Some(done),
            _ => None,
        }
    }

    /// Sends a request that gets no response (id 0), without waiting.
    pub fn send_oneway(&self, mut frame: OutFrame) -> Result<(), NetError> {
        self.check_size(&frame)?;
        frame.id = 0;
        self.writer.try_send(frame)
    }

    /// Forgets a request (a caller that stopped waiting): its response,
    /// if one comes, is discarded. Returns whether it was still pending.
    pub fn cancel(&self, id: u64) -> bool {
        self.pending.lock().remove(&id).is_some()
    }

    /// Registers a push stream: `handler` gets the pushes with this stream
    /// id, in order, on the reader task, and is dropped when the connection
    /// ends. Ignored on a dead connection.
    pub fn open_stream(&self, stream: u64, handler: PushHandler) {
        if !self.is_dead() {
            self.streams.lock().insert(stream, handler);
        }
    }

    pub fn close_stream(&self, stream: u64) {
        let handler = self.streams.lock().remove(&stream);
        drop(handler);
    }

    /// Ends the connection: stops the reader, fails every pending request
    /// with [`NetError::Lost`] (caused by `cause`) and drops every stream
    /// handler. Must not be called from a push handler (return `Err`).
    pub fn kill(&self, cause: NetError) {
        self.end(Arc::new(cause));
    }

    pub(crate) fn end(&self, cause: Arc<NetError>) {
        if let Some(reader) = self.reader.get() {
            reader.abort();
        }
        tracing::debug!(peer = %self.peer, reason = %cause, "connection ended");
        self.fail_all(cause);
    }

    fn fail_all(&self, cause: Arc<NetError>) {
        self.dead.store(true, Ordering::Release);
        let pending: Vec<_> = self.pending.lock().drain().collect();
        for (_, p) in pending {
            let _ = p.done.complete(Err(NetError::Lost {
                peer: self.peer.to_string(),
                cause: cause.clone(),
            }));
        }
        let streams = std::mem::take(&mut *self.streams.lock());
        drop(streams);
    }
}

async fn read_loop<B: LentBuffer, C: Complete<B>>(
    mux: Arc<MuxConn<B, C>>,
    reader: FrameReader<BoxRead>,
    busy_poll: Duration,
) {
    let cause = match mux.direct_read.clone() {
        None => hold_and_read(&mux, reader, busy_poll).await,
        Some(sock) => {
            *mux.idle_reader.lock() = Some(reader);
            share_and_read(&mux, &*sock, busy_poll).await
        }
    };
    tracing::debug!(peer = %mux.peer, reason = %cause, "connection ended");
    mux.fail_all(cause);
}

/// The reader task of a socket only it reads.
async fn hold_and_read<B: LentBuffer, C: Complete<B>>(
    mux: &MuxConn<B, C>,
    mut reader: FrameReader<BoxRead>,
    busy_poll: Duration,
) -> Arc<NetError> {
    loop {
        if !busy_poll.is_zero() {
            if let Err(e) = spin::busy_poll(reader.ready(), busy_poll).await {
                return Arc::new(e);
            }
        }
        match read_one(mux, &mut reader).await {
            Ok(true) => {}
            Ok(false) => return Arc::new(NetError::Closed),
            Err(e) => return e,
        }
    }
}

/// The reader task of a socket a waiting thread may read too: it waits
/// for bytes without the frame reader, takes it to route what arrived,
/// and gives it back at a frame boundary. When a thread holds the reader,
/// that thread routes what arrived: the task lets go of the readiness
/// (the runtime keeps any that came after) and waits for the next.
async fn share_and_read<B: LentBuffer, C: Complete<B>>(
    mux: &MuxConn<B, C>,
    sock: &dyn DirectRead,
    busy_poll: Duration,
) -> Arc<NetError> {
    loop {
        let readable = std::future::poll_fn(|cx| sock.poll_readable(cx));
        if let Err(e) = spin::busy_poll(readable, busy_poll).await {
            return Arc::new(NetError::io("waiting for the connection", e));
        }
        let mut taken = None;
        let _ = sock.try_io_read(&mut || {
            taken = mux.take_reader_for_task();
            match taken {
                Some(_) => Ok(()),
                None => Err(std::io::ErrorKind::WouldBlock.into()),
            }
        });
        let Some(mut reader) = taken else {
            continue;
        };
        let routed = read_available(mux, &mut reader).await;
        mux.give_back(reader);
        match routed {
            Ok(true) => {}
            Ok(false) => return Arc::new(NetError::Closed),
            Err(e) => return e,
        }
    }
}

/// Routes every frame that has arrived, and returns at a frame boundary
/// once nothing more is there; `Ok(false)` when the peer closed.
async fn read_available<B: LentBuffer, C: Complete<B>>(
    mux: &MuxConn<B, C>,
    reader: &mut FrameReader<BoxRead>,
) -> Result<bool, Arc<NetError>> {
    loop {
        let more = {
            let mut ready = std::pin::pin!(reader.ready());
            std::future::poll_fn(|cx| std::task::Poll::Ready(ready.as_mut().poll(cx))).await
        };
        match more {
            std::task::Poll::Pending => return Ok(true),
            std::task::Poll::Ready(Ok(false)) => return Ok(false),
            std::task::Poll::Ready(Err(e)) => return Err(Arc::new(e)),
            std::task::Poll::Ready(Ok(true)) => {}
        }
        if !read_one(mux, reader).await? {
            return Ok(false);
        }
    }
}

impl<B: LentBuffer, C: Complete<B>> MuxConn<B, C> {
    pub(crate) fn take_reader(&self) -> Option<FrameReader<BoxRead>> {
        self.idle_reader.lock().take()
    }

    /// The frame reader for the reader task, woken by bytes; when a thread
    /// holds it, notes so (under the same lock, so the thread's next
    /// `give_back` is ordered after it and sees the note).
    fn take_reader_for_task(&self) -> Option<FrameReader<BoxRead>> {
        let mut idle = self.idle_reader.lock();
        let taken = idle.take();
        if taken.is_none() {
            self.task_missed.store(true, Ordering::Release);
        }
        taken
    }

    /// Puts the frame reader back and tells whoever waits for it.
    pub(crate) fn give_back(&self, reader: FrameReader<BoxRead>) {
        *self.idle_reader.lock() = Some(reader);
        let waiting = std::mem::take(&mut *self.want_reader.lock());
        waiting.iter().for_each(|b| b.ring());
    }
}

/// Reads and routes one frame; `Ok(false)` when the peer closed cleanly.
pub(crate) async fn read_one<B: LentBuffer, C: Complete<B>>(
    mux: &MuxConn<B, C>,
    reader: &mut FrameReader<BoxRead>,
) -> Result<bool, Arc<NetError>> {
    let Some((header, body)) = reader.next().await? else {
        return Ok(false);
    };
    let heard = u64::try_from(mux.born.elapsed().as_millis()).unwrap_or(u64::MAX);
    mux.last_heard_ms.store(heard, Ordering::Relaxed);
    match header.kind {
        FrameKind::Response => {
            let pending = mux.pending.lock().remove(&header.id);
            let Some(mut p) = pending else {
                // Nobody waits for it any more (cancelled).
                reader.skip_bulk().await?;
                return Ok(true);
            };
            let outcome = match receive_bulk(reader, &header, &mut p).await {
                Ok(Ok(())) => Ok(Reply {
                    header,
                    body,
                    buffers: p.buffers,
                }),
                Ok(Err(refused)) => Err(refused),
                Err(e) => {
                    let e = Arc::new(e);
                    // The request whose answer broke the stream learns why.
                    let own = match *e {
                        NetError::BulkMismatch {
                            announced,
                            expected,
                        } => NetError::BulkMismatch {
                            announced,
                            expected,
                        },
                        _ => NetError::Lost {
                            peer: mux.peer.to_string(),
                            cause: e.clone(),
                        },
                    };
                    let _ = p.done.complete(Err(own));
                    return Err(e);
                }
            };
            p.done.complete(outcome)?;
        }
        FrameKind::Push => {
            reader.skip_bulk().await?;
            if let Some(handler) = mux.streams.lock().get_mut(&header.id) {
                handler(header, body)?;
            }
        }
        FrameKind::Request => {
            return Err(Arc::new(NetError::Proto(ProtoError::Unknown {
                what: "frame kind from a server",
                value: header.kind as u64,
            })))
        }
    }
    Ok(true)
}

/// Reads a response's bulk payload into the request's lent buffers, or
/// nothing if it announces none; any other length is a mismatch, which
/// ends the connection (`Err`). A fill plan that does not fit its buffers
/// fails only its request (`Ok(Err)`), the payload skipped.
async fn receive_bulk<B: LentBuffer, C>(
    reader: &mut FrameReader<BoxRead>,
    header: &FrameHeader,
    p: &mut Pending<B, C>,
) -> Result<Result<(), NetError>, NetError> {
    if header.bulk_len == 0 {
        return Ok(Ok(()));
    }
    if header.bulk_len != p.planned {
        return Err(NetError::BulkMismatch {
            announced: header.bulk_len,
            expected: p.planned,
        });
    }
    // The plan comes from the caller: check it before reading anything.
    let fits = p.plan.iter().all(|&(idx, start, len)| {
        p.buffers.get_mut(idx).is_some_and(|b| {
            start
                .checked_add(len)
                .is_some_and(|end| end <= b.bulk_dst().len())
        })
    });
    if !fits {
        reader.skip_bulk().await?;
        return Ok(Err(NetError::FillPlan {
            buffers: p.buffers.len(),
        }));
    }
    let mut rest = &p.plan[..];
    while let Some(&(idx, start, len)) = rest.first() {
        let run = small_run(rest);
        if run < 2 {
            let dst = &mut p.buffers[idx].bulk_dst()[start..start + len];
            reader.read_bulk_into(dst).await?;
            rest = &rest[1..];
            continue;
        }
        let (pieces, after) = rest.split_at(run);
        let total = pieces.iter().map(|p| p.2).sum();
        let mut fill = Scatter {
            pieces,
            at: 0,
            buffers: &mut p.buffers,
        };
        reader
            .read_bulk_with(total, |bytes| fill.put(bytes))
            .await?;
        rest = after;
    }
    Ok(Ok(()))
}

/// A piece of a fill plan below this size is read with the small pieces
/// around it, in one read, then copied into place: a fetch of many small
/// events would otherwise cost a read (a system call) per event.
const GATHER_BELOW: usize = 16 << 10;
/// The most bytes gathered in one run.
const GATHER_MOST: usize = 256 << 10;

/// How many pieces at the start of `plan` form a run of small ones.
fn small_run(plan: &[(usize, usize, usize)]) -> usize {
    let mut total = 0;
    plan.iter()
        .take_while(|&&(_, _, len)| {
            total += len;
            len < GATHER_BELOW && total <= GATHER_MOST
        })
        .count()
}

/// Copies a run's bytes, as they arrive, over its pieces in order.
struct Scatter<'a, B> {
    pieces: &'a [(usize, usize, usize)],
    /// Bytes of the first piece already filled.
    at: usize,
    buffers: &'a mut [B],
}

impl<B: LentBuffer> Scatter<'_, B> {
    fn put(&mut self, mut bytes: &[u8]) {
        while let Some(&(idx, start, len)) = self.pieces.first() {
            if bytes.is_empty() {
                return;
            }
            let n = (len - self.at).min(bytes.len());
            let from = start + self.at;
            self.buffers[idx].bulk_dst()[from..from + n].copy_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
            self.at += n;
            if self.at == len {
                self.pieces = &self.pieces[1..];
                self.at = 0;
            }
        }
    }
}
